# Stage: the tiny local models that stand in for Qwen2.5-Math-1.5B and Llama-3.2-1B-Instruct (the
# toy world, and the real world on a CPU: config/real-smoke.yaml); a model given by hub id or
# folder is loaded by the SFT rule. The tokenizer is trained on the world's own texts (the real
# world's prepared data sets), in the style `models.<m>.tokenizer` names.
# Only the models some cell uses are built (pretraining one costs minutes), each by its own job:
# adding a model to the grid, or building one alone first, never rebuilds (and so never reruns the
# cells of) another. A model's weights depend on the seed, the world's texts and its own entry only.
USED_MODELS = list(dict.fromkeys([*grid.models(config), *grid.extra_models(config)]))
TINY_FOLDERS = sorted({f for f in (grid.tiny_folder(config, m) for m in USED_MODELS) if f})


def folder_models(wildcards):
    """The models (usually one) whose tiny model lives in this folder."""
    return [m for m in USED_MODELS if grid.tiny_folder(config, m) == wildcards.folder]


rule tiny_model:
    input:
        rules.toy_world.output if WORLD == "toy" else expand(
            f"{RESULTS}/real/data/{{ds}}/{{split}}.jsonl", ds=DATASETS, split=["train", "test"]
        ),
    output:
        f"{RESULTS}/models/{{folder}}/config.json",
    wildcard_constraints:
        folder="|".join(re.escape(f) for f in TINY_FOLDERS) or "(?!)",
    params:
        cfg=lambda w: cli_config("seed", "world", "toy", "experts", "models", only={"models": folder_models(w)}),
        env=job_env,
        root=f"{RESULTS}/{WORLD}",
        out=f"{RESULTS}/models",
    # pretraining (toy.pretrain.steps) is minutes of compute with nothing beside it: every core
    threads: workflow.cores if config["toy"]["pretrain"]["steps"] else config["threads"]
    log:
        f"{LOGS}/tiny_models/{{folder}}.log",
    shell:
        "{params.env} {MEML} tiny-models --root {params.root} --out {params.out} --config-json {params.cfg} > {log} 2>&1"
