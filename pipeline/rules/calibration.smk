# Stage: the calibration gate, between MEF and RL. Each SFT model a method starts RL from is
# measured (rollout success on training questions, finished share, greedy accuracy, answer
# balance of the test split); calibration.gate: stop ends the workflow here when a value is
# outside calibration.ranges, warn records it for the report.


rule calibrate:
    input:
        str(LAYOUT.sft("{model}", "{ds}", "{variant}") / "DONE"),
        test=lambda w: test_file(grid.run_seed(w.variant), w.ds),
    output:
        str(LAYOUT.calibration("{model}", "{ds}", "{variant}")),
    params:
        # of the report section only the headline expert (whose greedy accuracy is measured): adding a
        # replicate or a stages run to the report must rerun the report alone
        cfg=lambda w: cli_config(
            "profile", "world", "seed", "device", "precision", "rl", "rl_by_dataset", "experts", "reward", "report",
            "calibration", only={"report": ["headline_expert"]}, dataset=w.ds,
        ),
        experts=variant_experts,
        model=str(LAYOUT.sft("{model}", "{ds}", "{variant}") / "model"),
        data=lambda w: f"{seed_world(grid.run_seed(w.variant))}/data",  # its training questions are the seed's
    threads: gpu_threads(GPU)
    resources:
        gpu=GPU,
    log:
        f"{LOGS}/calibration/{{model}}/{{ds}}/{{variant}}.log",
    shell:
        JOB_ENV + "{ON_GPU} {MEML} calibrate --checkpoint {params.model} --dataset {wildcards.ds} --experts {params.experts} "
        "--data-root {params.data} --where {wildcards.model}/{wildcards.ds}/{wildcards.variant} --out {output} "
        "--config-json {params.cfg} {RUN_SETTINGS} > {log} 2>&1"
