# Stage: MEF, multi-expert SFT. One run per model, data set and SFT variant (the experts whose
# trajectories it learns, e.g. e0-e1-e2); methods with the same SFT data share the run. Where
# grid.seeds_vary retrains SFT, each seed has its own run (e0-e1-e2/seed3), from its own base.
# With launch.processes > 1 each job runs data-parallel on that many GPUs (accelerate launch).


rule sft:
    input:
        base_model_files,
        # the seed's own world where seeds redraw the data (grid.seeds_vary: data)
        data=lambda w: f"{seed_world(grid.run_seed(w.variant))}/data/{w.ds}/train.jsonl",
        experts=lambda w: expand(f"{seed_world(grid.run_seed(w.variant))}/experts/{w.ds}/e{{k}}.jsonl", k=ALL_EXPERTS),
        lengths=length_check,  # the trajectories fit RL's cap (real world; rules/experts.smk)
    output:
        str(LAYOUT.sft("{model}", "{ds}", "{variant}") / "DONE"),
    params:
        cfg=cli_config(
            "profile", "world", "seed", "device", "precision", "gradient_checkpointing", "launch", "models", "sft", "experts",
            only=SEEDS_VARY,
        ),
        experts=variant_experts,
        seed=variant_seed,
        launch=lambda w: launcher(f"sft/{w.model}/{w.ds}/{w.variant}"),
    threads: gpu_threads(GPU * PROCESSES)
    resources:
        gpu=GPU * PROCESSES,
    log:
        f"{LOGS}/sft/{{model}}/{{ds}}/{{variant}}.log",
    shell:
        JOB_ENV + "{ON_GPUS} {params.launch} sft --model {wildcards.model} --dataset {wildcards.ds} --experts {params.experts} "
        "{params.seed} --config-json {params.cfg} {RUN_SETTINGS} > {log} 2>&1"
