# Stage: expert trajectories of the real world. Expert 0 is the data set's own rationale; the
# others are teacher-model trajectories found in `experts.trajectories` (the toy world's come
# from the generator, in data.smk).


rule import_experts:
    input:
        f"{RESULTS}/real/data/{{ds}}/train.jsonl",
    output:
        expand(f"{RESULTS}/real/experts/{{{{ds}}}}/e{{k}}.jsonl", k=ALL_EXPERTS),
    params:
        cfg=cli_config("experts", "world"),
    log:
        f"{LOGS}/experts/{{ds}}.log",
    shell:
        "{MEML} import-experts --dataset {wildcards.ds} --data {RESULTS}/real/data/{wildcards.ds} "
        "--out {RESULTS}/real/experts/{wildcards.ds} --config-json {params.cfg} > {log} 2>&1"
