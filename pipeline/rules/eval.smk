# Stage: evaluation of every cell's final model through lm-eval, greedy, under each of the
# method's evaluated experts' prompts, plus their majority vote. Results go to the cell's MLflow run.


rule evaluate:
    input:
        f"{RESULTS}/rl/{{model}}/{{ds}}/{{method}}/seed{{seed}}/DONE",
        test=f"{RESULTS}/{WORLD}/data/{{ds}}/test.jsonl",
    output:
        f"{RESULTS}/eval/{{model}}/{{ds}}/{{method}}/seed{{seed}}.json",
    params:
        cfg=cli_config("profile", "world", "device", "precision", "eval", "rl", "rl_by_dataset", "experts", "mlflow"),
        experts=lambda w: ",".join(str(k) for k in grid.eval_experts(config, w.method)),
        run=rl_run_dir,
        env=job_env,
        data=DATA,
        headline=config["report"]["headline_expert"],
        # the cell's MLflow run (its id sits in the RL run folder) gets the evaluation too
        log_to_run=lambda w: f"--log-to-run {rl_run_dir(w)}" if config["mlflow"]["enabled"] else "",
    threads: config["threads"]
    resources:
        gpu=GPU,
    log:
        f"{LOGS}/eval/{{model}}/{{ds}}/{{method}}/seed{{seed}}.log",
    shell:
        "{params.env} {MEML} eval --checkpoint {params.run}/model --dataset {wildcards.ds} --experts {params.experts} "
        "--data-root {params.data} {params.log_to_run} --out {output:q} --config-json {params.cfg} > {log:q} 2>&1 "
        "&& {PROGRESS} {output:q} {PROGRESS_STATE} e{params.headline}"
