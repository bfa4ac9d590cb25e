# Stage: the calibration gate, between MEF and RL. Each SFT model a method starts RL from is
# measured (rollout success on training questions, finished share, greedy accuracy, answer
# balance of the test split); calibration.gate: stop ends the workflow here when a value is
# outside calibration.ranges, warn records it for the report.


rule calibrate:
    input:
        f"{RESULTS}/sft/{{model}}/{{ds}}/{{variant}}/DONE",
        test=f"{RESULTS}/{WORLD}/data/{{ds}}/test.jsonl",
    output:
        f"{RESULTS}/calibration/{{model}}/{{ds}}/{{variant}}.json",
    params:
        cfg=cli_config(
            "profile", "world", "seed", "device", "precision", "rl", "rl_by_dataset", "experts", "reward", "report",
            "calibration",
        ),
        experts=lambda w: ",".join(k.lstrip("e") for k in w.variant.split("-")),
    threads: config["threads"]
    resources:
        gpu=GPU,
    log:
        f"{LOGS}/calibration/{{model}}/{{ds}}/{{variant}}.log",
    shell:
        f"{ENV} {{MEML}} calibrate --checkpoint {RESULTS}/sft/{{wildcards.model}}/{{wildcards.ds}}/{{wildcards.variant}}/model "
        "--dataset {wildcards.ds} --experts {params.experts} --data-root " + f"{RESULTS}/{WORLD}/data "
        "--where {wildcards.model}/{wildcards.ds}/{wildcards.variant} --out {output} --config-json {params.cfg} > {log} 2>&1"


def calibration_failures():
    """The gate's messages, printed when the workflow stops (they are also in the jobs' logs)."""
    return [p.read_text(encoding="utf-8") for p in sorted(Path(RESULTS, "calibration").glob("*/*/*.failed"))]
