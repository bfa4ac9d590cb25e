# Stage: the data sets. Toy: the generator writes all three data sets and every expert's
# trajectories at once. Real: each data set is loaded by hub id or from `data.<ds>.local`.


rule toy_world:
    output:
        expand(str(LAYOUT.data("toy", "{ds}") / "{split}.jsonl"), ds=DATASETS, split=["train", "test"]),
        expand(str(LAYOUT.experts("toy", "{ds}") / "e{k}.jsonl"), ds=DATASETS, k=ALL_EXPERTS),
    params:
        cfg=cli_config("seed", "toy", "experts"),
        out=str(LAYOUT.world("toy")),
    log:
        f"{LOGS}/toy_world.log",
    shell:
        "{MEML} toy-world --out {params.out} --config-json {params.cfg} > {log} 2>&1"


rule toy_seed_world:
    # grid.seeds_vary: data: grid seed k's own training questions and trajectories, drawn beside the
    # shared world's test questions (and StrategyQA's creatures), which it repeats; with world, its
    # own test questions and creatures too
    output:
        # {{seed}}: a wildcard that expand() leaves in place
        expand(str(LAYOUT.data("toy", "{ds}", "seed{{seed}}") / "{split}.jsonl"), ds=DATASETS, split=["train", "test"]),
        expand(str(LAYOUT.experts("toy", "{ds}", "seed{{seed}}") / "e{k}.jsonl"), ds=DATASETS, k=ALL_EXPERTS),
    params:
        # seeds_vary only where a seed draws a world of its own, so other designs keep their params
        cfg=cli_config("seed", "toy", "experts", only={"grid": ["datasets", *(["seeds_vary"] if grid.varies(config, "world") else [])]}),
        out=lambda w: str(LAYOUT.world("toy", f"seed{w.seed}")),
    log:
        f"{LOGS}/toy_world/seed{{seed}}.log",
    shell:
        "{MEML} toy-world --out {params.out} --seed {wildcards.seed} --config-json {params.cfg} > {log} 2>&1"


rule toy_stats:
    input:
        rules.toy_world.output,
    output:
        f"{REPORT}/toy_stats.md",
        f"{REPORT}/toy_stats.json",
    params:
        root=str(LAYOUT.world("toy")),
        out=f"{REPORT}/toy_stats",
    log:
        f"{LOGS}/toy_stats.log",
    shell:
        "{MEML} toy-stats --root {params.root} --out {params.out} > {log} 2>&1"


rule prepare_real:
    output:
        str(LAYOUT.data("real", "{ds}") / "train.jsonl"),
        str(LAYOUT.data("real", "{ds}") / "test.jsonl"),
    params:
        cfg=cli_config("data"),
        out=str(LAYOUT.data_root("real")),
    log:
        f"{LOGS}/prepare/{{ds}}.log",
    shell:
        "{MEML} prepare --dataset {wildcards.ds} --out {params.out} --config-json {params.cfg} > {log} 2>&1"
