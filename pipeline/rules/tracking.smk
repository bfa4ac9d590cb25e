# Stage: the MLflow store and the profile's experiment, created once by one job before any job
# that logs (several processes creating a new SQLite store at once corrupt it).


rule mlflow_store:
    output:
        str(LAYOUT.mlflow_marker),
    params:
        cfg=cli_config("profile", "mlflow"),
    log:
        f"{LOGS}/mlflow_store.log",
    shell:
        "{MEML} mlflow-init --out {output} --config-json {params.cfg} > {log} 2>&1"
