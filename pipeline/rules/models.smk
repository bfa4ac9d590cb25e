# Stage: the tiny local models that stand in for Qwen2.5-Math-1.5B and Llama-3.2-1B-Instruct.


rule tiny_models:
    input:
        rules.toy_world.output,
    output:
        expand(f"{RESULTS}/models/{{model}}/config.json", model=TINY_MODELS),
    params:
        seed=config["seed"],
        vocab=config["toy"]["vocab_size"],
    log:
        f"logs/{PROFILE}/tiny_models.log",
    shell:
        "HF_HUB_OFFLINE=1 {MEML} tiny-models --root {RESULTS}/toy --out {RESULTS}/models "
        "--set seed={params.seed} --set toy.vocab_size={params.vocab} > {log} 2>&1"
