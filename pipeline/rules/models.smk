# Stage: the tiny local models that stand in for Qwen2.5-Math-1.5B and Llama-3.2-1B-Instruct in
# the toy world (the real world loads its models by hub id in the SFT rule).


rule tiny_models:
    input:
        rules.toy_world.output,
    output:
        expand(f"{RESULTS}/models/{{arch}}/config.json", arch=["qwen2", "llama"]),
    params:
        cfg=cli_config("seed", "toy", "experts"),
    threads: config["threads"]
    log:
        f"{LOGS}/tiny_models.log",
    shell:
        f"{ENV} {{MEML}} tiny-models --root {RESULTS}/toy --out {RESULTS}/models --config-json {{params.cfg}} "
        "> {log} 2>&1"


def base_model_files(wildcards):
    """The tiny model's files, or nothing for a model loaded by hub id."""
    arch = grid.tiny_arch(config, wildcards.model)
    return [f"{RESULTS}/models/{arch}/config.json"] if arch else []
