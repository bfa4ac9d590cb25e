# MEML-GRPO reproduction DAG: `snakemake --cores N` (the toy default) or `--configfile config/paper.yaml`.
# One rule file a stage (pipeline/rules/; common.smk: the checks and what rules share); a run's start and
# end: pipeline/meml/lifecycle.py. The default config is read from the workflow's own folder (--directory).
from snakemake.utils import min_version

min_version("9.0")


configfile: f"{workflow.basedir}/config/default.yaml"


include: "pipeline/rules/common.smk"
include: "pipeline/rules/tracking.smk"
include: "pipeline/rules/data.smk"
include: "pipeline/rules/experts.smk"
include: "pipeline/rules/models.smk"
include: "pipeline/rules/sft.smk"
include: "pipeline/rules/calibration.smk"
include: "pipeline/rules/rl.smk"
include: "pipeline/rules/eval.smk"
include: "pipeline/rules/analysis.smk"
include: "pipeline/rules/report.smk"


onstart:
    teacher_stage.check(workflow, config, NODE_GPUS)  # no API teacher on a GPU node (plan/teacher_stage.py)
    lifecycle.start(workflow, config, GPU)


onsuccess:
    lifecycle.finish(workflow, config)


onerror:
    lifecycle.failed(workflow, config)


rule all:
    input:
        rules.report.output,
        [f"{REPORT}/toy_stats.md"] if WORLD == "toy" else [],
    default_target: True
