# Stage: expert trajectories of the real world (the toy world's come from the generator, in
# data.smk). Expert 0 is the data set's own rationale; expert k >= 1 is written by its teacher
# (`teachers.e<k>`: an OpenAI-compatible API, a local vLLM model, or your own JSONL), rejection-
# sampled by the answer checker. The teacher cache (results/<profile>/real/teacher_cache/) is not
# an output: Snakemake never deletes it, so a rerun only asks for what is missing.
# `snakemake ... teachers` (make teachers) runs this stage alone, on a machine without a GPU, and a
# local run with GPUs refuses to start an API teacher (plan/teacher_stage.py; docs/gpus-and-clusters.md).


def vllm_teacher(k):
    """Whether expert k's teacher is a local model on a GPU (backend vllm), not an API or a file."""
    return config["teachers"].get(f"e{k}", {}).get("backend") == "vllm"


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
    # an API teacher waits on the network for hours: one thread and no GPU, never a GPU job's share
    threads: lambda w: gpu_threads(1) if vllm_teacher(w.k) else 1
    resources:
        gpu=lambda w: 1 if vllm_teacher(w.k) else 0,
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


# RL's check of the trajectories' lengths (training/lengths.py), as a job of its own right after the
# teachers and before SFT: for the RL cells of this model and data set, the share of their experts'
# trajectories longer than their rl.max_new_tokens, in the base model's tokenizer, against
# rl.max_truncated_share. A cap that does not fit stops the run here, before SFT is paid for, with
# RL's message; RL checks again when it starts. SFT takes its output as `ancient`: a changed cap
# checks again without retraining SFT (and once an SFT run of the pair has finished, a cap that does
# not fit is a warning here, its output kept, and RL's own refusal).
rule trajectory_lengths:
    input:
        base_model_files,
        data=str(LAYOUT.data("real", "{ds}") / "train.jsonl"),
        experts=lambda w: [
            str(LAYOUT.experts("real", w.ds) / f"e{k}.jsonl")
            for k in sorted({k for c in teacher_stage.checks_before_sft(config, w.model, w.ds) for k in c["experts"]})
        ],
    output:
        str(LAYOUT.lengths("{model}", "{ds}")),
    params:
        checks=lambda w: shlex.quote(json.dumps(teacher_stage.checks_before_sft(config, w.model, w.ds))),
        model=lambda w: base_model_path(w),
        data=str(LAYOUT.data("real", "{ds}")),
        experts=str(LAYOUT.experts("real", "{ds}")),
        sft=str(LAYOUT.sft("{model}", "{ds}", "")),
    log:
        f"{LOGS}/lengths/{{model}}_{{ds}}.log",
    shell:
        JOB_ENV + "{MEML} check-lengths --model {params.model} --dataset {wildcards.ds} --data {params.data} "
        "--experts-dir {params.experts} --checks {params.checks} --sft {params.sft:q} --out {output:q} > {log:q} 2>&1"


def length_check(wildcards):
    """The check of an SFT run's trajectories against RL's cap (real world), as SFT's input."""
    return ancient(str(LAYOUT.lengths(wildcards.model, wildcards.ds))) if WORLD == "real" else []


# The teacher stage alone: every data set's expert trajectories and their check against RL's cap
# (and what they need: the data sets, the base models' tokenizers). `make teachers CONFIG=...`.
TRAINED = sorted({(c.model, c.dataset) for c in CELLS})  # the (model, data set) pairs SFT and RL train


rule teachers:
    input:
        expand(str(LAYOUT.experts(WORLD, "{ds}") / "e{k}.jsonl"), ds=sorted({ds for _, ds in TRAINED}), k=ALL_EXPERTS),
        [str(LAYOUT.lengths(m, ds)) for m, ds in TRAINED] if WORLD == "real" else [],
