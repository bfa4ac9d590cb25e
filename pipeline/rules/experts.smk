# Stage: expert trajectories of the real world (the toy world's come from the generator, in
# data.smk). Expert 0 is the data set's own rationale; expert k >= 1 is written by its teacher
# (`teachers.e<k>`: an OpenAI-compatible API, a local vLLM model, or your own JSONL), rejection-
# sampled by the answer checker. The teacher cache (results/<profile>/real/teacher_cache/) is not
# an output: Snakemake never deletes it, so a rerun only asks for what is missing.


rule gold_expert:
    input:
        str(LAYOUT.data("real", "{ds}") / "train.jsonl"),
    output:
        str(LAYOUT.experts("real", "{ds}") / "e0.jsonl"),
    params:
        data=str(LAYOUT.data("real", "{ds}")),
        out=str(LAYOUT.experts("real", "{ds}")),
    log:
        f"{LOGS}/experts/{{ds}}_e0.log",
    shell:
        "{MEML} gold-expert --dataset {wildcards.ds} --data {params.data} --out {params.out} > {log} 2>&1"


rule teacher_trajectories:
    input:
        byo_file,
        str(LAYOUT.data("real", "{ds}") / "train.jsonl"),
        rules.mlflow_store.output,
    output:
        str(LAYOUT.experts("real", "{ds}") / "e{k}.jsonl"),
        str(LAYOUT.experts("real", "{ds}") / "e{k}.stats.json"),
    wildcard_constraints:
        k=r"[1-9]\d*",
    params:
        # only this expert's teacher, so changing one teacher reruns only its expert
        cfg=lambda w: cli_config("profile", "mlflow", "experts", only={"teachers": [f"e{w.k}"]}),
    threads: config["threads"]
    resources:
        gpu=lambda w: 1 if config["teachers"].get(f"e{w.k}", {}).get("backend") == "vllm" else 0,
    log:
        f"{LOGS}/experts/{{ds}}_e{{k}}.log",
    shell:
        "{MEML} teach --dataset {wildcards.ds} --expert {wildcards.k} --config-json {params.cfg} {RUN_SETTINGS} > {log} 2>&1"


rule standin_byo:  # config/real-smoke.yaml: a bring-your-own file written from the gold rationales
    input:
        str(LAYOUT.data("real", "{ds}") / "train.jsonl"),
    output:
        str(LAYOUT.standin_byo() / "{ds}" / "e{k}.jsonl"),
    params:
        data=str(LAYOUT.data("real", "{ds}")),
        out=str(LAYOUT.standin_byo()),
    log:
        f"{LOGS}/experts/{{ds}}_e{{k}}_standin_byo.log",
    shell:
        "{MEML} standin-byo --dataset {wildcards.ds} --expert {wildcards.k} --data {params.data} --out {params.out} "
        "> {log} 2>&1"
