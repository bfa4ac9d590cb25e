# Stage: the tiny local models that stand in for Qwen2.5-Math-1.5B and Llama-3.2-1B-Instruct (the
# toy world, and the real world on a CPU: config/real-smoke.yaml); a model given by hub id or
# folder is loaded by the SFT rule. The tokenizer is trained on the world's own texts (the real
# world's prepared data sets), in the style `models.<m>.tokenizer` names.
# Only the models some cell uses are built (pretraining one costs minutes).
USED_MODELS = list(dict.fromkeys([*grid.models(config), *grid.extra_models(config)]))
TINY_FOLDERS = sorted({f for f in (grid.tiny_folder(config, m) for m in USED_MODELS) if f})


rule tiny_models:
    input:
        rules.toy_world.output if WORLD == "toy" else expand(
            f"{RESULTS}/real/data/{{ds}}/{{split}}.jsonl", ds=DATASETS, split=["train", "test"]
        ),
    output:
        expand(f"{RESULTS}/models/{{folder}}/config.json", folder=TINY_FOLDERS),
    params:
        cfg=cli_config("seed", "world", "toy", "experts", "models", only={"models": USED_MODELS}),
        env=job_env,
        root=f"{RESULTS}/{WORLD}",
        out=f"{RESULTS}/models",
    # pretraining (toy.pretrain.steps) is minutes of compute with nothing beside it: every core
    threads: workflow.cores if config["toy"]["pretrain"]["steps"] else config["threads"]
    log:
        f"{LOGS}/tiny_models.log",
    shell:
        "{params.env} {MEML} tiny-models --root {params.root} --out {params.out} --config-json {params.cfg} > {log} 2>&1"
