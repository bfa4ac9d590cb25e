# Stage: data sets and expert trajectories (toy: the generator; paper: the teacher issue).


rule toy_world:
    output:
        expand(f"{RESULTS}/toy/data/{{ds}}/{{split}}.jsonl", ds=DATASETS, split=["train", "test"]),
        expand(f"{RESULTS}/toy/experts/{{ds}}/e{{k}}.jsonl", ds=DATASETS, k=[0, 1, 2]),
    params:
        seed=config["seed"],
        sizes=shell_override("toy.sizes", config["toy"]["sizes"]),
    log:
        f"logs/{PROFILE}/toy_world.log",
    shell:
        "{MEML} toy-world --out {RESULTS}/toy --set seed={params.seed} "
        "--set {params.sizes} > {log} 2>&1"


rule toy_stats:
    input:
        rules.toy_world.output,
    output:
        f"{REPORT}/toy_stats.md",
        f"{REPORT}/toy_stats.json",
    log:
        f"logs/{PROFILE}/toy_stats.log",
    shell:
        "{MEML} toy-stats --root {RESULTS}/toy --out {REPORT}/toy_stats > {log} 2>&1"
