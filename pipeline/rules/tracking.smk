# Stage: the MLflow store and the profile's experiment, created once by one job before any job
# that logs (several processes creating a new SQLite store at once corrupt it). The mlflow keys are
# run keys (core/config.RUN_KEYS): they reach the job on its shell line, so pointing MLflow elsewhere
# reruns neither this job nor those that wait on it; the workflow's start makes the new store ready
# instead (lifecycle.mlflow_store), and the jobs that run log to it.


rule mlflow_store:
    output:
        str(LAYOUT.mlflow_marker),
    params:
        cfg=cli_config("profile", "mlflow"),
    log:
        f"{LOGS}/mlflow_store.log",
    shell:
        "{MEML} mlflow-init --out {output} --config-json {params.cfg} {RUN_SETTINGS} > {log} 2>&1"
