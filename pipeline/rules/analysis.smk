# Stage: expert complementarity of the MEF model (the paper's three experts), sampled k times
# per expert and question: how often the experts fail together, how often one rescues another.


rule complementarity:
    input:
        f"{RESULTS}/sft/{{model}}/{{ds}}/{grid.sft_variant(PAPER_EXPERTS)}/DONE",
        test=f"{RESULTS}/{WORLD}/data/{{ds}}/test.jsonl",
    output:
        multiext(f"{RESULTS}/analysis/complementarity/{{model}}_{{ds}}", ".json", ".png", ".pdf"),
    params:
        cfg=cli_config("profile", "world", "seed", "rl", "analysis", "experts"),
        model=f"{RESULTS}/sft/{{model}}/{{ds}}/{grid.sft_variant(PAPER_EXPERTS)}/model",
        experts=",".join(str(k) for k in PAPER_EXPERTS),
    threads: config["threads"]
    resources:
        gpu=GPU,
    log:
        f"{LOGS}/complementarity/{{model}}_{{ds}}.log",
    shell:
        f"{ENV} {{MEML}} complementarity --checkpoint {{params.model}} --dataset {{wildcards.ds}} "
        "--experts {params.experts} --data-root " + f"{RESULTS}/{WORLD}/data "
        "--out " + f"{RESULTS}/analysis/complementarity/{{wildcards.model}}_{{wildcards.ds}} "
        "--config-json {params.cfg} > {log} 2>&1"
