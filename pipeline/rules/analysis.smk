# Stage: expert complementarity (the paper's three experts), sampled k times per expert and
# question: how often the experts fail together, how often one rescues another. Of the MEF model
# under each expert's prompt (analysis.complementarity.source: mef), or of three single-expert SFT
# models (single_expert, the paper figure's reading).
COMPLEMENTARITY_SFT = grid.complementarity_sft_variants(config)


rule complementarity:
    input:
        [str(LAYOUT.sft("{model}", "{ds}", v) / "DONE") for v in COMPLEMENTARITY_SFT],
        test=lambda w: test_file(FIRST_SEED, w.ds),
    output:
        [str(LAYOUT.complementarity("{model}", "{ds}", ext)) for ext in ("json", "png", "pdf")],
    params:
        # the device and precision: it samples where its GPU is, through the engine rl.engine names there
        cfg=lambda w: cli_config("profile", "world", "seed", "device", "precision", "rl", "rl_by_dataset", "analysis",
                                 "experts", "reward", dataset=w.ds),
        model=",".join(str(LAYOUT.sft("{model}", "{ds}", v) / "model") for v in COMPLEMENTARITY_SFT),
        experts=",".join(str(k) for k in PAPER_EXPERTS),
        data=test_data(FIRST_SEED),
        out=str(LAYOUT.complementarity("{model}", "{ds}")).removesuffix(".json"),
    threads: gpu_threads(GPU)
    resources:
        gpu=GPU,
    log:
        f"{LOGS}/complementarity/{{model}}_{{ds}}.log",
    shell:
        JOB_ENV + "{ON_GPU} {MEML} complementarity --checkpoint {params.model} --dataset {wildcards.ds} "
        "--experts {params.experts} --data-root {params.data} --out {params.out} --config-json {params.cfg} {RUN_SETTINGS} > {log} 2>&1"
