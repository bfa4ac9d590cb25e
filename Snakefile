# MEML-GRPO reproduction DAG. `snakemake --cores N` runs the embedded default (toy world, CPU);
# `--configfile config/paper.yaml` the paper's grid. Rules live in pipeline/rules/, one file a stage.
import json
import shlex
import sys
from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")

# The default config is read from the workflow's own folder, so `--directory` does not break it.
configfile: Path(workflow.basedir) / "config" / "default.yaml"
validate(config, Path(workflow.basedir) / "config" / "schema.yaml")

PROFILE = config["profile"]
RESULTS = f"results/{PROFILE}"
REPORT = f"report/{PROFILE}"
DATASETS = list(config["toy"]["sizes"])
TINY_MODELS = ["qwen2", "llama"]
# The CLI of the Python that runs Snakemake (the project venv; a conda env when --use-conda).
MEML = f"{shlex.quote(sys.executable)} -m meml.cli"


def shell_override(key, value):
    """A `--set key=value` argument for the CLI, quoted for the shell (JSON is valid YAML)."""
    return shlex.quote(f"{key}={json.dumps(value)}")


include: "pipeline/rules/data.smk"
include: "pipeline/rules/models.smk"


rule all:
    input:
        f"{REPORT}/toy_stats.md",
        expand(f"{RESULTS}/models/{{model}}/config.json", model=TINY_MODELS),
