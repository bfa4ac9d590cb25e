"""Load a YAML config, fill its defaults (config/default.yaml, the one home of every value) through
config/schema.yaml, and reject unknown keys by name; compose the RL settings a cell runs with (`rl`,
the data set's `rl_by_dataset` entry, the method's own `rl`: method_rl).

The same check serves the workflow (pipeline/rules/common.smk) and the CLI.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from meml.core.io import DataError

PROJECT_ROOT = Path(__file__).resolve().parents[3]
SCHEMA_PATH = PROJECT_ROOT / "config" / "schema.yaml"
DEFAULT_CONFIG = PROJECT_ROOT / "config" / "default.yaml"


def _fill_defaults(schema: dict[str, Any], value: Any, root: dict[str, Any]) -> Any:
    if "$ref" in schema:
        name = schema["$ref"].split("/")[-1]
        schema = root["$defs"][name]
    if schema.get("type") == "object" and isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = _fill_defaults(sub, value[key], root)
        entries = schema.get("additionalProperties")
        if isinstance(entries, dict):  # a mapping of named entries (models, methods): each one's defaults
            for key in value.keys() - schema.get("properties", {}).keys():
                value[key] = _fill_defaults(entries, value[key], root)
    return value


def load_yaml(text: str) -> Any:
    """yaml.safe_load, through libyaml's C loader where PyYAML has it (5-10x faster: every job
    reads the config and its schema)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _defaults_from(node: dict[str, Any], values: Any) -> None:
    """Give every fixed key of the schema the value config/default.yaml holds as its default, so a
    config that sets a section only in part (a job's --config-json, a --set override) is filled
    from the one home of the defaults."""
    for key, sub in (node.get("properties") or {}).items():
        if isinstance(values, dict) and key in values:
            sub.setdefault("default", copy.deepcopy(values[key]))
            _defaults_from(sub, values[key])


@functools.cache
def schema() -> dict[str, Any]:
    """config/schema.yaml with its defaults taken from config/default.yaml (the schema file holds
    none for a key default.yaml holds), read once per process (treat as read-only)."""
    rules = dict(load_yaml(SCHEMA_PATH.read_text()))
    _defaults_from(rules, load_yaml(DEFAULT_CONFIG.read_text()))
    return rules


def validate(config: dict[str, Any], source: str = "config") -> dict[str, Any]:
    import jsonschema

    rules = schema()
    config = _fill_defaults(rules, copy.deepcopy(config), rules)
    errors = sorted(jsonschema.Draft202012Validator(rules).iter_errors(config), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        key = ".".join(str(p) for p in first.path) or "(top level)"
        raise DataError(f"invalid config: {first.message}", source, None, key)
    _check_rl_layers(config, rules["properties"]["rl"], source)
    return config


def _check_rl_layers(config: dict[str, Any], rl_schema: dict[str, Any], source: str) -> None:
    """Each layer laid over `rl` (a data set's `rl_by_dataset` entry, a method's own `rl`) must give
    settings that pass the schema of `rl` itself: checked here, once, so that every later reader of
    method_rl trusts what it gets."""
    import jsonschema

    layers = [(f"rl_by_dataset.{ds}", dataset_rl(config, ds)) for ds in config.get("rl_by_dataset") or {}]
    layers += [
        (f"methods.{name}.rl", method_rl(config, name))
        for name, entry in (config.get("methods") or {}).items()
        if isinstance(entry, dict) and entry.get("rl")
    ]
    for where, merged in layers:
        for err in jsonschema.Draft202012Validator(rl_schema).iter_errors(merged):
            key = ".".join([where, *(str(p) for p in err.path)])
            raise DataError(f"invalid RL setting: {err.message}", source, None, key)
    # how a job runs is one value for every job (the shell line's --run): a data set or a method of its own
    # would be dropped from the cell's values and never reach its job
    own = [(f"rl_by_dataset.{ds}", entry) for ds, entry in (config.get("rl_by_dataset") or {}).items()]
    own += [(f"methods.{name}.rl", entry.get("rl")) for name, entry in (config.get("methods") or {}).items()
            if isinstance(entry, dict)]  # fmt: skip
    rl_keys = [key.removeprefix("rl.") for key in RUN_KEYS if key.startswith("rl.")]
    for where, entry in own:
        for path in (path for key in rl_keys for path in _paths(entry or {}, key)):
            raise DataError(
                "how a job runs (core/config.RUN_KEYS), set in `rl` alone", source, None, ".".join([where, *path])
            )


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """`update` over `base`, dicts merged key by key: how Snakemake lays --configfile over the default."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _read_yaml(p: Path) -> dict[str, Any]:
    if not p.exists() or p.is_dir():  # a pipe is a file here too: --config <(...) works
        raise DataError("config file not found", p)
    try:
        data = load_yaml(p.read_text()) or {}
    except yaml.YAMLError as err:
        raise DataError(f"not valid YAML: {err}", p) from None
    if not isinstance(data, dict):
        raise DataError("config must be a mapping", p)
    return data


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None, run: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The default config, with `path` laid over it (as Snakemake does), then dotted overrides, then
    `run`: how the job runs (RUN_KEYS, with_run_settings)."""
    data = _read_yaml(DEFAULT_CONFIG)
    p = Path(path) if path else DEFAULT_CONFIG
    if p.resolve() != DEFAULT_CONFIG.resolve():
        data = deep_merge(data, _read_yaml(p))
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    with_run_settings(data, run or {}, str(p))
    return validate(data, str(p))


# The RL settings a cell runs with, composed here and read once into a type by training/rl.py (the
# planner asks the same questions without loading torch).


def rollouts_per_expert(group_size: int, n_experts: int, spread: str, method: str = "<method>") -> list[int]:
    """`split`: G shared, the first experts get one more (8 over 3 -> 3/3/2); `per_expert`: G each.
    A split that leaves an expert one rollout is refused: a subgroup of one always has advantage 0,
    so that expert would get no GRPO gradient at all (8 over 5 experts is 2/2/2/1/1)."""
    if spread == "per_expert":
        counts = [group_size] * n_experts
    elif spread == "split":
        counts = [group_size // n_experts + (1 if i < group_size % n_experts else 0) for i in range(n_experts)]
    else:
        raise DataError(f"unknown rollout spread '{spread}'; known: split, per_expert", None, None, "rl.spread")
    if min(counts) < 2:
        raise DataError(
            f"rl.group_size {group_size} split among {n_experts} experts gives rollouts {counts}: an expert with "
            f"fewer than 2 rollouts never gets an advantage; raise rl.group_size to {2 * n_experts} or more, "
            f"set rl.spread: per_expert, or use fewer methods.{method}.rl_experts",
            None,
            None,
            "rl.group_size",
        )
    return counts


def dataset_rl(cfg: dict[str, Any], dataset: str | None) -> dict[str, Any]:
    """`rl` with the data set's `rl_by_dataset` entry laid over it (every method's starting point)."""
    return deep_merge(cfg["rl"], ((cfg.get("rl_by_dataset") or {}).get(dataset) or {}) if dataset else {})


def method_rl(cfg: dict[str, Any], method: str, dataset: str | None = None) -> dict[str, Any]:
    """The RL settings a method runs with on a data set: `rl`, then the data set's `rl_by_dataset`
    entry, then the method's own `rl` overrides, each laid over the one before."""
    return deep_merge(dataset_rl(cfg, dataset), cfg["methods"][method].get("rl") or {})


# Keys that say how a job runs, not what it computes. They define no cell and rerun no job: the
# workflow hands them to the jobs on the shell line (`--run KEY=VALUE`: rules/common.smk's
# RUN_SETTINGS), outside the params Snakemake compares. `*` stands for each entry of a mapping.
# "Round-off": the key changes a number only where floats are summed in another order (another split
# of a sum, another kernel, other padding), never a random draw; an RL run records those it ran
# under (DONE's `environment`), an evaluation its batch size (its file), and docs/reliability.md
# ("Same seed, same numbers") says what that means for two runs.
RUN_KEYS = (
    "threads",  # round-off: torch's thread count splits each matrix product's sums (DONE: environment.threads)
    "launch.gpu_memory_gib",  # read by the dry run's memory check alone
    "sft.checkpoint_every",  # how often a killed SFT run can resume from where it was; a resume is exact
    "rl.checkpoint_every",  # the same for RL: a checkpoint holds every RNG state (tests/test_fault_injection.py)
    "rl.keep_checkpoints",  # what stays on disk once DONE is written
    "rl.micro_batch_tokens",  # round-off: the update's sums grouped otherwise (DONE: environment.micro_batch_tokens)
    "rl.vllm.gpu_memory_utilization",  # round-off: vLLM's KV cache, so how many requests it batches; each has its seed
    "rl.vllm.cpu_kv_cache_gib",  # the same on a CPU
    "rl.vllm.enforce_eager",  # round-off: CUDA graphs or eager kernels for the same operations
    "eval.batch_size",  # round-off: greedy decoding (no draw) of other batches; vLLM sizes its own
    "mlflow.*",  # the whole section: where the results are mirrored, not what they are (core/tracking.py)
    "teachers.*.api_key_env",  # how a teacher is asked; its cache keys on none of these (data/teachers.SHAPING)
    "teachers.*.timeout",
    "teachers.*.retries",
    "teachers.*.backoff_base",
    "teachers.*.backoff_max",
    "teachers.*.concurrency",
)
# Keys that look like run keys and are not:
#   rl.rollout_batch_size   the kv and hf engines draw each row's random numbers batch after batch
#                           from one generator: another split hands the rows other draws, other tokens
#   rl.vllm.max_model_len   caps prompt + completion: where it binds, it cuts a rollout (scored 0)
#   teachers.*.max_attempts more attempts accept more questions


def _is_run_key(dotted: str) -> bool:
    parts = dotted.split(".")
    return any(
        len(key) == len(parts) and all(k in ("*", p) for k, p in zip(key, parts, strict=True))
        for key in (k.split(".") for k in RUN_KEYS)
    )


def _paths(cfg: dict[str, Any], key: str) -> list[tuple[str, ...]]:
    """The paths of `cfg` a run key names that `cfg` holds (`*`: each entry of that mapping)."""
    found: list[tuple[tuple[str, ...], Any]] = [((), cfg)]
    for part in key.split("."):
        found = [
            ((*path, name), value[name])
            for path, value in found
            if isinstance(value, dict)
            for name in (value if part == "*" else [part] if part in value else [])
        ]
    return [path for path, _ in found]


def _get(cfg: dict[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        cfg = cfg[part]
    return cfg


def run_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The RUN_KEYS the config holds, by dotted key (a teacher's only where its entry sets it)."""
    return {".".join(path): _get(cfg, path) for key in RUN_KEYS for path in _paths(cfg, key)}


def run_values(cfg: dict[str, Any], section: str) -> dict[str, Any]:
    """One section's RUN_KEYS with their values, nested as in the section: what a job lays over the
    cell's values to run (deep_merge)."""
    out: dict[str, Any] = {}
    for dotted, value in run_settings(cfg).items():
        first, *path = dotted.split(".")
        if first != section or not path:  # another section's, or a top-level key (threads)
            continue
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def _drop(node: Any, parts: list[str]) -> Any:
    if not isinstance(node, dict):
        return node
    head, *rest = parts
    if not rest:
        return {k: v for k, v in node.items() if head not in ("*", k)}
    return {k: _drop(v, rest) if head in ("*", k) else v for k, v in node.items()}


def without_run_keys(section: str, values: dict[str, Any]) -> dict[str, Any]:
    """A config section's values less its RUN_KEYS: what a job's result depends on."""
    for key in RUN_KEYS:
        first, *rest = key.split(".")
        if first == section and rest:
            values = _drop(values, rest)
    return values


def _in_order(node: Any, rules: dict[str, Any], defs: dict[str, Any]) -> Any:
    if "$ref" in rules:
        rules = {**defs[rules["$ref"].split("/")[-1]], **{k: v for k, v in rules.items() if k != "$ref"}}
    if not isinstance(node, dict):
        return node
    fixed = rules.get("properties") or {}
    entries = rules.get("additionalProperties")
    keys = [k for k in fixed if k in node] + [k for k in node if k not in fixed]
    return {
        k: _in_order(node[k], fixed[k] if k in fixed else entries if isinstance(entries, dict) else {}, defs)
        for k in keys
    }


def in_schema_order(section: str, values: Any) -> Any:
    """A config section with its keys in config/schema.yaml's order wherever the schema names them,
    named entries (models, methods, teachers) in the config's own order (the tables' order). Snakemake
    lays the config files over the default in the order they name keys, so a file that names a key
    (one of the RUN_KEYS, say) moves its section within the dict; in schema order, what a job is
    given does not depend on that."""
    rules = schema()
    return _in_order(values, rules["properties"].get(section) or {}, rules.get("$defs") or {})


def with_run_settings(data: dict[str, Any], run: dict[str, Any], source: str = "config") -> None:
    """Lay `--run` values over a config (in place): each must be a RUN_KEY, and is set only where
    the config holds the entry it belongs to, so the run keys of every teacher can go to a job that
    reads one teacher's entry."""
    for dotted, value in run.items():
        if not _is_run_key(dotted):
            known = ", ".join(RUN_KEYS)
            raise DataError(f"--run sets how a job runs, one of {known}; use --set", source, None, dotted)
        *parents, last = dotted.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[last] = value


def offline_env(cfg: dict[str, Any]) -> dict[str, str]:
    """The environment that keeps a job off the network: the toy world never touches a hub."""
    return {"HF_HUB_OFFLINE": "1"} if cfg["world"] == "toy" else {}
