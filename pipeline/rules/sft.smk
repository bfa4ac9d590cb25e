# Stage: MEF, multi-expert SFT. One run per model, data set and SFT variant (the experts whose
# trajectories it learns, e.g. e0-e1-e2); methods with the same SFT data share the run.


rule sft:
    input:
        base_model_files,
        data=f"{RESULTS}/{WORLD}/data/{{ds}}/train.jsonl",
        experts=expand(f"{RESULTS}/{WORLD}/experts/{{{{ds}}}}/e{{k}}.jsonl", k=ALL_EXPERTS),
    output:
        f"{RESULTS}/sft/{{model}}/{{ds}}/{{variant}}/DONE",
    params:
        cfg=cli_config("profile", "world", "seed", "device", "models", "sft", "experts"),
        experts=lambda w: ",".join(k.lstrip("e") for k in w.variant.split("-")),
    threads: config["threads"]
    resources:
        gpu=GPU,
    log:
        f"{LOGS}/sft/{{model}}/{{ds}}/{{variant}}.log",
    shell:
        f"{ENV} {{MEML}} sft --model {{wildcards.model}} --dataset {{wildcards.ds}} --experts {{params.experts}} "
        "--config-json {params.cfg} > {log} 2>&1"
