# Stage: RIEL, one RL run per cell (model x data set x method x seed), each logged to its own
# MLflow run (the store is created by tracking.smk's rule before any RL job). With
# launch.processes > 1 each job runs data-parallel on that many GPUs (accelerate launch).


rule rl:
    input:
        sft=lambda w: str(LAYOUT.sft(w.model, w.ds, sft_variant(w)) / "DONE"),
        # the gate set to stop holds RL back until its model is measured; a warning (the default)
        # does not, so changing what the gate measures never retrains a cell
        calibration=lambda w: (
            str(LAYOUT.calibration(w.model, w.ds, sft_variant(w)))
            if config["calibration"]["gate"] == "stop"
            else []
        ),
        mlflow=rules.mlflow_store.output,
    output:
        str(LAYOUT.rl(W) / "DONE"),
    params:
        cfg=lambda w: cli_config(
            "profile", "world", "seed", "device", "precision", "gradient_checkpointing", "launch", "models", "sft", "rl",
            "rl_by_dataset", "reward", "experts", "mlflow", only={"methods": [w.method], **SEEDS_VARY}, dataset=w.ds,
        ),
        launch=lambda w: launcher(f"rl/{w.model}/{w.ds}/{w.method}/{w.seed}"),
    threads: gpu_threads(GPU * PROCESSES)
    resources:
        gpu=GPU * PROCESSES,
    log:
        f"{LOGS}/rl/{{model}}/{{ds}}/{{method}}/seed{{seed}}.log",
    shell:
        JOB_ENV + "{ON_GPUS} {params.launch} rl --model {wildcards.model} --dataset {wildcards.ds} --method {wildcards.method:q} "
        "--seed {wildcards.seed} --config-json {params.cfg} {RUN_SETTINGS} > {log} 2>&1"


# The same cell trained by trl's GRPOTrainer (trl.methods), side by side with our loop: the same SFT
# model, questions in the same order, reward and settings (training/trl_grpo.py).
rule trl_grpo:
    input:
        sft=lambda w: str(LAYOUT.sft(w.model, w.ds, sft_variant(w)) / "DONE"),
        # after the cell's own run, not beside it: the two are timed one after the other
        ours=str(LAYOUT.rl(W) / "DONE"),
    output:
        str(LAYOUT.trl(W) / "DONE"),
    params:
        cfg=lambda w: cli_config(
            "profile", "world", "seed", "device", "precision", "models", "sft", "rl", "rl_by_dataset", "reward",
            "experts", "trl", only={"methods": [w.method], "trl": ["vllm"], **SEEDS_VARY}, dataset=w.ds,
        ),
    threads: gpu_threads(GPU)
    resources:
        gpu=GPU,
    log:
        f"{LOGS}/trl/{{model}}/{{ds}}/{{method}}/seed{{seed}}.log",
    shell:
        JOB_ENV + "{ON_GPU} {MEML} trl-grpo --model {wildcards.model} --dataset {wildcards.ds} --method {wildcards.method:q} "
        "--seed {wildcards.seed} --config-json {params.cfg} {RUN_SETTINGS} > {log} 2>&1"
