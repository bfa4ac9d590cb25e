# Stage: evaluation of every cell's final model through lm-eval, greedy, under each of the
# method's evaluated experts' prompts, plus their majority vote. Results go to the cell's MLflow run
# (its id sits in the RL run folder) where mlflow.enabled, a run key (core/config.RUN_KEYS).


rule evaluate:
    input:
        str(LAYOUT.rl(W) / "DONE"),
        test=lambda w: test_file(w.seed, w.ds),
    output:
        str(LAYOUT.eval(W)),
    params:
        cfg=lambda w: cli_config(
            "profile", "world", "device", "precision", "eval", "rl", "rl_by_dataset", "experts", "mlflow", dataset=w.ds
        ),
        experts=lambda w: ",".join(str(k) for k in grid.eval_experts(config, w.method)),
        run=rl_run_dir,
        data=lambda w: test_data(w.seed),
        headline=config["report"]["headline_expert"],
    threads: gpu_threads(GPU)
    resources:
        gpu=GPU,
    log:
        f"{LOGS}/eval/{{model}}/{{ds}}/{{method}}/seed{{seed}}.log",
    shell:
        JOB_ENV + "{ON_GPU} {MEML} eval --checkpoint {params.run}/model --dataset {wildcards.ds} --experts {params.experts} "
        "--data-root {params.data} --log-to-run {params.run} --out {output:q} --config-json {params.cfg} {RUN_SETTINGS} > {log:q} 2>&1 "
        "&& {PROGRESS} {output:q} {PROGRESS_STATE} e{params.headline}"


def base_model_path(wildcards):
    """The model a grid model starts from, as the eval CLI takes it: its built folder or its hub id."""
    folder = grid.base_folder(config, wildcards.model)  # the first seed's where seeds retrain pretraining
    return shlex.quote(str(LAYOUT.models / folder) if folder else str(config["models"][wildcards.model]["source"]))


# The base model before any training (eval.base), zero-shot under every expert's prompt, the same
# lm-eval task, questions and length cap as the cells: the base table's rows.
rule evaluate_base:
    input:
        base_model_files,
        test=lambda w: test_file(FIRST_SEED, w.ds),
    output:
        str(LAYOUT.eval_base("{model}", "{ds}")),
    params:
        cfg=lambda w: cli_config(
            "profile", "world", "device", "precision", "eval", "rl", "rl_by_dataset", "experts", dataset=w.ds
        ),
        experts=",".join(str(k) for k in ALL_EXPERTS),
        model=base_model_path,
        data=test_data(FIRST_SEED),
    threads: gpu_threads(GPU)
    resources:
        gpu=GPU,
    log:
        f"{LOGS}/eval/{{model}}/{{ds}}/base.log",
    shell:
        JOB_ENV + "{ON_GPU} {MEML} eval --checkpoint {params.model} --dataset {wildcards.ds} --experts {params.experts} "
        "--data-root {params.data} --out {output:q} --config-json {params.cfg} {RUN_SETTINGS} > {log:q} 2>&1"


# Each SFT model an RL cell starts from (eval.sft), under every expert's prompt, with the cells' own
# task, questions and cap: the learning table's other side (what RL added, paired by question).
rule evaluate_sft:
    input:
        str(LAYOUT.sft("{model}", "{ds}", "{variant}") / "DONE"),
        test=lambda w: test_file(grid.run_seed(w.variant), w.ds),
    output:
        str(LAYOUT.eval_sft("{model}", "{ds}", "{variant}")),
    params:
        cfg=lambda w: cli_config(
            "profile", "world", "device", "precision", "eval", "rl", "rl_by_dataset", "experts", dataset=w.ds
        ),
        experts=",".join(str(k) for k in ALL_EXPERTS),
        model=str(LAYOUT.sft("{model}", "{ds}", "{variant}") / "model"),
        data=lambda w: test_data(grid.run_seed(w.variant)),
    threads: gpu_threads(GPU)
    resources:
        gpu=GPU,
    log:
        f"{LOGS}/eval/{{model}}/{{ds}}/sft/{{variant}}.log",
    shell:
        JOB_ENV + "{ON_GPU} {MEML} eval --checkpoint {params.model} --dataset {wildcards.ds} --experts {params.experts} "
        "--data-root {params.data} --out {output:q} --config-json {params.cfg} {RUN_SETTINGS} > {log:q} 2>&1"


# The trl-trained cell (trl.methods), evaluated as the cell itself is.
rule evaluate_trl:
    input:
        str(LAYOUT.trl(W) / "DONE"),
        test=lambda w: test_file(w.seed, w.ds),
    output:
        str(LAYOUT.trl(W) / "eval.json"),
    params:
        cfg=lambda w: cli_config(
            "profile", "world", "device", "precision", "eval", "rl", "rl_by_dataset", "experts", dataset=w.ds
        ),
        experts=lambda w: ",".join(str(k) for k in grid.eval_experts(config, w.method)),
        model=lambda w: shlex.quote(str(LAYOUT.trl(grid.Cell(w.model, w.ds, w.method, w.seed)) / "model")),
        data=lambda w: test_data(w.seed),
    threads: gpu_threads(GPU)
    resources:
        gpu=GPU,
    log:
        f"{LOGS}/eval/trl/{{model}}/{{ds}}/{{method}}/seed{{seed}}.log",
    shell:
        JOB_ENV + "{ON_GPU} {MEML} eval --checkpoint {params.model} --dataset {wildcards.ds} --experts {params.experts} "
        "--data-root {params.data} --out {output:q} --config-json {params.cfg} {RUN_SETTINGS} > {log:q} 2>&1"
