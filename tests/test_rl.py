"""The RL loop end to end on tiny models: methods, expert prompts, IML and HSFT firing, resume."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from scripted import ScriptedEngine, scripted_engine, train
from transformers import AutoModelForCausalLM, AutoTokenizer

from meml.core.config import load_config, rollouts_per_expert
from meml.core.environment import weights_sha256
from meml.core.io import DataError
from meml.core.records import read_records
from meml.data.experts import DEFAULT_PROMPTS
from meml.data.tiny_models import build_tiny_models, toy_corpus
from meml.training.groups import QuestionOrder
from meml.training.rl import Method
from meml.training.rollout import HFEngine, Sampling
from meml.training.sft import run_sft

CONFIG = load_config()
METHODS = CONFIG["methods"]


def tiny_settings(**changes: Any) -> dict[str, Any]:
    settings = json.loads(json.dumps(CONFIG["rl"]))
    settings.update(
        steps=2,
        questions_per_step=2,
        group_size=6,
        max_new_tokens=12,
        checkpoint_every=1,
        rollout_batch_size=16,
        max_truncated_share=1.0,  # 12-token rollouts: the trajectories do not fit, on purpose
    )
    settings["buffer"].update(capacity=2)
    settings.update(changes)
    return settings


@pytest.fixture(scope="module")
def base_model(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rl_models")
    return build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), out, seed=0, vocab_size=500)["qwen2"]


def test_rollout_spread() -> None:
    assert rollouts_per_expert(8, 3, "split") == [3, 3, 2]
    assert rollouts_per_expert(8, 1, "split") == [8]
    assert rollouts_per_expert(8, 3, "per_expert") == [8, 8, 8]
    assert rollouts_per_expert(10, 5, "split") == [2, 2, 2, 2, 2]
    with pytest.raises(DataError, match=r"'rl.group_size'.*rollouts \[2, 2, 2, 1, 1\]"):
        rollouts_per_expert(8, 5, "split")


def test_the_smaller_subgroup_turns_from_question_to_question() -> None:
    """8 over 3 experts is 3/3/2; which expert gets the 2 depends on the question, about a third of
    the questions each, the same in every run; the group still has G rollouts."""
    from meml.training.groups import question_counts

    counts = rollouts_per_expert(8, 3, "split")
    small = [question_counts(counts, f"gsm8k-train-{i}").index(2) for i in range(3000)]
    shares = [small.count(e) / len(small) for e in range(3)]
    assert all(abs(share - 1 / 3) < 0.03 for share in shares), shares
    assert all(sum(question_counts(counts, f"q{i}")) == 8 for i in range(50))
    assert question_counts(counts, "q7") == question_counts(counts, "q7")
    assert question_counts([8], "q7") == [8]


def test_question_order_is_seeded_and_resumable() -> None:
    a = QuestionOrder(5, seed=1)
    first = a.take(7)
    assert sorted(first[:5]) == list(range(5))  # an epoch is a permutation
    state = a.state_dict()
    b = QuestionOrder(5, seed=1)
    b.load_state_dict(state)
    assert a.take(6) == b.take(6)


def test_each_expert_samples_under_its_own_prompt_and_iml_hsft_fire(
    small_world: Path, base_model: Path, tmp_path: Path
) -> None:
    data = small_world / "data/gsm8k"
    engine = scripted_engine(base_model, data)
    method = Method.from_config("MEML-GRPO", METHODS["MEML-GRPO"])
    train(
        tiny_settings(),
        method,
        base_model,
        data,
        small_world / "experts/gsm8k",
        tmp_path,
        engine=engine,
        progress=False,
    )
    # 2 steps x 2 questions x 3 experts; within a step the prompts go question by question, expert 0, 1, 2
    assert len(engine.calls) == 12
    for i, text in enumerate(engine.calls):
        expert = i % 3
        assert f"<|im_start|>system\n{DEFAULT_PROMPTS[expert]}<|im_end|>" in text
        assert all(DEFAULT_PROMPTS[k] not in text for k in range(3) if k != expert)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    for m in lines:
        assert m["reward/expert1"] == 1.0 and m["reward/expert0"] == 0.0
        assert m["subgroups/all_wrong/expert0"] == 1.0 and m["subgroups/all_correct/expert1"] == 1.0
        assert m["iml/pairs"] == 2.0 and m["loss/iml"] != 0  # expert 1 beats the worst on both questions
    assert lines[0]["hsft/flushes"] + lines[1]["hsft/flushes"] >= 1  # capacity 2, 4 hard offers a step
    assert any(m["loss/sft"] > 0 for m in lines)
    assert (tmp_path / "DONE").is_file() and (tmp_path / "model/config.json").is_file()
    environment = json.loads((tmp_path / "DONE").read_text())["environment"]
    assert environment["start_weights_sha256"] == weights_sha256(base_model)
    assert environment["threads"] == torch.get_num_threads()
    # a run key that moves a number at round-off only: the run's record, not the cell (docs/reliability.md)
    assert environment["micro_batch_tokens"] == tiny_settings()["micro_batch_tokens"] and "vllm" not in environment


def test_a_rollout_cut_at_the_cap_gets_reward_zero(small_world: Path, base_model: Path) -> None:
    from meml.core.answers import RewardConfig
    from meml.training.groups import sample_groups

    data = small_world / "data/gsm8k"
    batch = read_records(data / "train.jsonl")[:2]
    rewarded = RewardConfig(format_bonus=0.1)
    scored = {}
    for finished in (True, False):  # the same replies, ended by a stop token or cut at the cap
        engine = scripted_engine(base_model, data)
        engine.finished = finished
        scored[finished] = sample_groups(
            engine, engine.tokenizer, batch, [0, 1], [2, 2], Sampling(), DEFAULT_PROMPTS, rewarded
        )
    # expert 1 answers right ("#### <gold>": 1 + the format bonus), expert 0 wrong (the bonus only)
    assert torch.equal(scored[True].rewards[:, 1], torch.full((2, 2), 1.1)) and scored[True].correct[:, 1].all()
    assert torch.equal(scored[True].rewards[:, 0], torch.full((2, 2), 0.1))
    assert scored[False].rewards.eq(0).all() and not scored[False].correct.any()


@pytest.fixture(scope="module")
def sft_model(small_world: Path, base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sft")
    settings = dict(CONFIG["sft"], epochs=1, max_length=384, batch_size=16)
    summary = run_sft(base_model, small_world / "data/gsm8k", small_world / "experts/gsm8k", out, [0, 1, 2], settings)
    assert summary["examples"] == 180 and summary["loss_curve"][-1] < summary["loss_curve"][0]
    assert summary["environment"]["start_weights_sha256"] == weights_sha256(base_model)
    return out / "model"


def test_sft_trains_on_assistant_tokens_with_expert_prompts(small_world: Path, sft_model: Path) -> None:
    from meml.training.sft import sft_examples

    examples = sft_examples(small_world / "data/gsm8k", small_world / "experts/gsm8k", [1])
    assert len(examples) == 60
    assert all(e["messages"][0]["content"] == DEFAULT_PROMPTS[1] for e in examples)
    assert all("<think>" in e["messages"][2]["content"] for e in examples)
    assert AutoModelForCausalLM.from_pretrained(sft_model).config.model_type == "qwen2"


@pytest.mark.parametrize(
    "name", ["Expert1-SFT-GRPO", "Expert1-SFT-Dr.GRPO", "MoE-SFT-GRPO", "MoE-SFT-Dr.GRPO", "MEML-GRPO"]
)
def test_every_method_runs_end_to_end_with_its_switches(
    name: str, small_world: Path, sft_model: Path, tmp_path: Path
) -> None:
    """Each method's switches show in what its steps did: its experts' rewards only, IML pairs and
    buffer insertions only where switched on, and the logged total the weighted sum at the config's
    lambdas (the gradient itself is held to the formula in tests/test_update.py). The rollouts are
    scripted (expert 1 right, the others wrong), so that pairs and failures exist to be seen."""
    method = Method.from_config(name, METHODS[name])
    settings = tiny_settings(lambda_iml=0.3, lambda_sft=0.7)
    data = small_world / "data/gsm8k"
    engine = scripted_engine(sft_model, data)
    summary = train(settings, method, sft_model, data, small_world / "experts/gsm8k", tmp_path, engine=engine)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and summary["steps"] == 2
    experts = {f"reward/expert{k}" for k in METHODS[name]["rl_experts"]}
    assert {k for k in lines[0] if re.fullmatch(r"reward/expert\d", k)} == experts
    for m in lines:
        assert m["loss/total"] == pytest.approx(m["loss/policy"] + 0.3 * m["loss/iml"] + 0.7 * m["loss/sft"], abs=1e-6)
    if not method.iml:
        assert all(m["iml/pairs"] == 0 and m["loss/iml"] == 0 for m in lines)
    else:  # expert 1 right, the others wrong: a pair on every question, and its loss
        assert all(m["iml/pairs"] == 2 and m["loss/iml"] != 0 for m in lines)
    if not method.hsft:
        assert all(m["hsft/inserted"] == 0 and m["loss/sft"] == 0 for m in lines)
    else:  # experts 0 and 2 fail: the buffer takes their questions, and a full one (capacity 2) is drained
        assert sum(m["hsft/inserted"] for m in lines) > 0 and any(m["hsft/sft_examples"] > 0 for m in lines)


def _metrics_without_timings(path: Path) -> list[dict[str, float]]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def test_killed_and_restarted_run_equals_uninterrupted(small_world: Path, sft_model: Path, tmp_path: Path) -> None:
    method = Method.from_config("MEML-GRPO", METHODS["MEML-GRPO"])
    settings = tiny_settings(steps=4, checkpoint_every=2, updates_per_batch=2)
    args = (method, sft_model, small_world / "data/gsm8k", small_world / "experts/gsm8k")
    train(settings, *args, tmp_path / "whole", seed=3, progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(settings, *args, tmp_path / "killed", seed=3, stop_after=3, progress=False)
    assert not (tmp_path / "killed/DONE").exists()
    assert len((tmp_path / "killed/metrics.jsonl").read_text().splitlines()) == 3  # step 3 ran, unsaved
    train(settings, *args, tmp_path / "killed", seed=3, progress=False)  # the same command again
    assert _metrics_without_timings(tmp_path / "whole/metrics.jsonl") == _metrics_without_timings(
        tmp_path / "killed/metrics.jsonl"
    )
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "whole/model").state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "killed/model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_changed_values_discard_old_checkpoints(small_world: Path, sft_model: Path, tmp_path: Path) -> None:
    """A run folder left by a killed run with other values (the config changed in between) is
    not resumed: its checkpoints and metrics belong to another experiment."""
    method = Method.from_config("MoE-SFT-GRPO", METHODS["MoE-SFT-GRPO"])
    old, new = tiny_settings(steps=3, checkpoint_every=1, lr=0.05), tiny_settings(steps=3, checkpoint_every=1)
    args = (method, sft_model, small_world / "data/gsm8k", small_world / "experts/gsm8k")
    with pytest.raises(KeyboardInterrupt):
        train(old, *args, tmp_path / "run", seed=1, params={"lr": 0.05}, stop_after=2, progress=False)
    assert (tmp_path / "run/checkpoints/step-000002").is_dir()
    train(new, *args, tmp_path / "fresh", seed=1, params={"lr": new["lr"]}, progress=False)
    train(new, *args, tmp_path / "run", seed=1, params={"lr": new["lr"]}, progress=False)
    assert json.loads((tmp_path / "run/cell.json").read_text()) == {"lr": new["lr"]}
    assert _metrics_without_timings(tmp_path / "run/metrics.jsonl") == _metrics_without_timings(
        tmp_path / "fresh/metrics.jsonl"
    )


def test_incomplete_checkpoint_is_never_resumed(tmp_path: Path) -> None:
    from meml.training import checkpoint

    checkpoint.save(tmp_path, 2, {"step": 2})
    (tmp_path / "step-000004").mkdir()  # a checkpoint killed before its COMPLETE marker
    assert checkpoint.latest(tmp_path) == tmp_path / "step-000002"


def test_hf_engine_returns_completions_per_prompt(base_model: Path) -> None:
    tok = AutoTokenizer.from_pretrained(base_model)
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(base_model), tok, batch_size=3)
    prompts = [tok("a b", add_special_tokens=False)["input_ids"], tok("c", add_special_tokens=False)["input_ids"]]
    torch.manual_seed(0)
    out = engine.generate(prompts, 2, Sampling(max_new_tokens=5))
    assert [len(x) for x in out] == [2, 2]
    assert [len(x) for x in engine.generate(prompts, [3, 1], Sampling(max_new_tokens=5))] == [3, 1]
    assert all(len(c.token_ids) <= 5 and tok.pad_token_id not in c.token_ids for x in out for c in x)


def test_rl_command_runs_a_method_with_its_own_rl_settings(small_world: Path, sft_model: Path, tmp_path: Path) -> None:
    """`methods.<name>.rl` overrides reach the loop: here one step instead of the global two."""
    import shutil

    from meml.cli import main

    shutil.copytree(small_world, tmp_path / "toy")
    quick = {**METHODS["MoE-SFT-GRPO"], "rl": {"steps": 1, "spread": "per_expert"}}
    sections = {"rl": tiny_settings(), "methods": {"Quick": quick}, "mlflow": {"enabled": False}}
    args = ["rl", "--dataset", "gsm8k", "--method", "Quick", "--sft-dir", str(sft_model), "--results", str(tmp_path)]
    assert main([*args, "--config-json", json.dumps(sections)]) == 0
    run = tmp_path / "rl/qwen2/gsm8k/Quick/seed0"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1
    assert json.loads((run / "cell.json").read_text())["rl"]["spread"] == "per_expert"


def test_informative_groups_by_hand() -> None:
    from meml.training.groups import Groups

    # question 0: expert 0 has 1/0 (spread); question 1: every slot 0; question 2: all 1 but a padded slot
    rewards = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 0.0]]])
    valid = torch.ones(3, 2, 2, dtype=torch.bool)
    valid[2, 1, 1] = False  # expert 1 has one rollout there: the 0 is padding, not a reward
    groups = Groups([], [], [], rewards, rewards > 0, valid, [[2, 2], [2, 2], [2, 1]])
    assert groups.informative().tolist() == [True, False, False]


class HalfRightEngine(ScriptedEngine):
    """On the questions in `solvable`, every expert alternates right and wrong (a reward spread);
    on the others every rollout is wrong (no gradient)."""

    def __init__(self, tokenizer: Any, answers: dict[str, str], solvable: set[str]) -> None:
        super().__init__(tokenizer, answers)
        self.solvable = solvable

    def replies(self, text: str, question: str, k: int) -> list[str]:
        right = f"#### {self.answers[question]}" if question in self.solvable else "#### 100000"
        return [right if i % 2 == 0 else "#### 100000" for i in range(k)]


def test_dynamic_sampling_replaces_questions_without_reward_spread(
    small_world: Path, base_model: Path, tmp_path: Path
) -> None:
    data = small_world / "data/gsm8k"
    records = read_records(data / "train.jsonl")
    answers = {r.question: r.answer for r in records}
    solvable = {r.question for i, r in enumerate(records) if i % 3 == 0}
    order = QuestionOrder(len(records), seed=0).take(40)
    method = Method.from_config("DS", {**METHODS["MoE-SFT-GRPO"], "dynamic_sampling": 2})
    engine = HalfRightEngine(AutoTokenizer.from_pretrained(base_model), answers, solvable)
    train(tiny_settings(steps=1), method, base_model, data, small_world / "experts/gsm8k", tmp_path, engine=engine,
           progress=False)  # fmt: skip
    # by hand: the first 2 questions of the order; each round replaces the unsolvable ones with the next ones
    batch, taken, replaced, rounds = order[:2], 2, 0, 0
    while rounds < 2 and any(records[i].question not in solvable for i in batch):
        dead = [j for j, i in enumerate(batch) if records[i].question not in solvable]
        for j in dead:
            batch[j], taken = order[taken], taken + 1
        replaced, rounds = replaced + len(dead), rounds + 1
    assert replaced > 0  # the chosen order does exercise the replacement
    m = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert (m["dynamic/replaced"], m["dynamic/rounds"]) == (replaced, rounds)
    assert m["rollouts/sampled"] == (2 + replaced) * 6  # G = 6 shared by the three experts
    # every question was asked of the three experts; the questions trained on are the last batch
    assert len(engine.calls) == 3 * (2 + replaced)
    # the step trains on the final batch: only its still-unsolvable questions are all wrong
    assert m["subgroups/all_wrong"] == pytest.approx(sum(records[i].question not in solvable for i in batch) / 2)


def _flush_run(
    small_world: Path, base_model: Path, out: Path, lambda_sft: float = 0.5, **buffer: Any
) -> dict[str, torch.Tensor]:
    """One MEML step whose buffer fills (capacity 2, scripted failures): the flush step's weights."""
    data = small_world / "data/gsm8k"
    settings = tiny_settings(steps=1, lambda_sft=lambda_sft)
    settings["buffer"].update(buffer)
    method = Method.from_config("MEML-GRPO", METHODS["MEML-GRPO"])
    engine = scripted_engine(base_model, data)
    train(settings, method, base_model, data, small_world / "experts/gsm8k", out, engine=engine, progress=False)
    assert json.loads((out / "metrics.jsonl").read_text())["hsft/flushes"] == 1
    return AutoModelForCausalLM.from_pretrained(out / "model").state_dict()


def test_hsft_readings_reach_their_own_knobs(small_world: Path, base_model: Path, tmp_path: Path) -> None:
    """joint: lambda_sft * L_SFT joins the RL step (sft_lr unused); separate: a step of its own at
    sft_lr (lambda_sft unused)."""

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(a[k], b[k]) for k in a)

    joint = _flush_run(small_world, base_model, tmp_path / "j1", update="joint", sft_lr=1e-3)
    assert same(joint, _flush_run(small_world, base_model, tmp_path / "j2", update="joint", sft_lr=0.5))
    slow = _flush_run(small_world, base_model, tmp_path / "s1", update="separate", sft_lr=1e-12)
    fast = _flush_run(small_world, base_model, tmp_path / "s2", update="separate", sft_lr=1e-2)
    assert not same(slow, fast) and not same(joint, fast)
    assert not same(joint, _flush_run(small_world, base_model, tmp_path / "j3", 5.0, update="joint", sft_lr=1e-3))
    assert same(fast, _flush_run(small_world, base_model, tmp_path / "s3", 5.0, update="separate", sft_lr=1e-2))


def test_rl_budget_in_epochs_is_counted_on_the_data_sets_size(
    small_world: Path, base_model: Path, tmp_path: Path
) -> None:
    data = small_world / "data/gsm8k"
    engine = scripted_engine(base_model, data)
    method = Method.from_config("Expert1-SFT-GRPO", METHODS["Expert1-SFT-GRPO"])
    # 60 training questions, 2 a step: 0.05 epochs = 1.5 steps -> 2 (rl.steps 99 is not used)
    done = train(tiny_settings(steps=99, epochs=0.05), method, base_model, data, small_world / "experts/gsm8k",
                  tmp_path, engine=engine, progress=False)  # fmt: skip
    assert done["steps"] == 2 and len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_rl_refuses_caps_that_cut_the_trajectories(small_world: Path, base_model: Path, tmp_path: Path) -> None:
    method = Method.from_config("MEML-GRPO", METHODS["MEML-GRPO"])
    with pytest.raises(DataError, match=r"'rl.max_new_tokens'.*of expert 0's SFT trajectories are longer than"):
        train(tiny_settings(max_truncated_share=0.05), method, base_model, small_world / "data/gsm8k",
               small_world / "experts/gsm8k", tmp_path, progress=False)  # fmt: skip
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("rows_per_pass", [1, 2, 8])
def test_completion_logprobs_are_the_next_token_log_probs_of_each_completion(
    base_model: Path, rows_per_pass: int
) -> None:
    """Logits at position t predict token t + 1: completion token j is scored by the logits at
    len(prompt) + j - 1. Checked against one unpadded forward pass per row, for rows of different
    lengths given longest first (so the length sort reorders them), scored one, two or all rows a
    pass (right-padded, logits only from the shortest prompt on): each row comes back in its place."""
    from meml.training.scoring import completion_logprobs

    model = AutoModelForCausalLM.from_pretrained(base_model).eval()
    prompts = [[5, 9, 14, 3, 6, 6], [5, 9, 14, 3], [7, 2], [13]]
    completions = [[11, 4, 9], [11, 4], [8, 6, 12, 10], [3]]
    with torch.no_grad():
        logp, mask, entropy = completion_logprobs(
            model, prompts, completions, pad=0, with_entropy=True, rows_per_pass=rows_per_pass
        )
        for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            logits = model(input_ids=torch.tensor([p + c])).logits[0].float()
            log_probs = [torch.log_softmax(logits[len(p) + j - 1], -1) for j in range(len(c))]
            expected = [lp[token] for lp, token in zip(log_probs, c, strict=True)]
            assert torch.allclose(logp[row, : len(c)], torch.stack(expected), atol=1e-5)
            assert entropy is not None
            assert torch.allclose(entropy[row, : len(c)], torch.stack([-(lp.exp() * lp).sum() for lp in log_probs]),
                                  atol=1e-5)  # fmt: skip
            assert not logp[row, len(c) :].any() and not entropy[row, len(c) :].any()  # zero past the completion
    assert mask.tolist() == [[True] * 3 + [False], [True] * 2 + [False] * 2, [True] * 4, [True] + [False] * 3]


class SpreadEngine(ScriptedEngine):
    """Every expert's subgroup has one right answer and the rest wrong: a reward spread in each
    subgroup (so the advantage's std matters) and equal expert means (so IML finds no pair)."""

    def replies(self, text: str, question: str, k: int) -> list[str]:
        return [f"#### {self.answers[question]}"] + ["#### 100000"] * (k - 1)


def _one_step(small_world: Path, base_model: Path, out: Path, engine: Any, **switches: Any) -> dict[str, torch.Tensor]:
    data = small_world / "data/gsm8k"
    method = Method.from_config("m", {**METHODS["MoE-SFT-GRPO"], **switches})
    train(tiny_settings(steps=1), method, base_model, data, small_world / "experts/gsm8k", out, engine=engine,
           progress=False)  # fmt: skip
    return AutoModelForCausalLM.from_pretrained(out / "model").state_dict()


def test_each_switch_reaches_the_update(small_world: Path, base_model: Path, tmp_path: Path) -> None:
    """Run one step with a switch on and off from the same start: the weights must differ (a loop
    that ignored `advantage` or `iml` would give identical weights)."""

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(a[k], b[k]) for k in a)

    data = small_world / "data/gsm8k"
    spread = scripted_engine(base_model, data)
    spread.__class__ = SpreadEngine
    grpo = _one_step(small_world, base_model, tmp_path / "grpo", spread, advantage="grpo")
    again = _one_step(small_world, base_model, tmp_path / "again", spread, advantage="grpo")
    drgrpo = _one_step(small_world, base_model, tmp_path / "drgrpo", spread, advantage="drgrpo")
    assert same(grpo, again) and not same(grpo, drgrpo)
    # expert 1 always right, the others always wrong: no advantage anywhere, only IML moves weights
    plain = _one_step(small_world, base_model, tmp_path / "plain", scripted_engine(base_model, data), iml=False)
    iml = _one_step(small_world, base_model, tmp_path / "iml", scripted_engine(base_model, data), iml=True)
    assert not same(plain, iml)
    assert json.loads((tmp_path / "iml/metrics.jsonl").read_text())["iml/pairs"] > 0


def test_every_rl_setting_comes_from_its_own_key_and_a_missing_key_is_named() -> None:
    """Each field of RLSettings takes the value of the config key of its name, converted to its type:
    changing one key changes that field alone. A missing key is named."""
    import dataclasses

    from meml.training.rl import RLSettings

    base = RLSettings.from_config(CONFIG["rl"])
    assert (base.steps, base.group_size, base.buffer.capacity, base.epochs) == (3, 8, 8, None)
    nested = {"buffer", "vllm"}
    for key in [f.name for f in dataclasses.fields(RLSettings) if f.name not in nested]:
        changed = json.loads(json.dumps(CONFIG["rl"]))
        old = changed.get(key, True)
        if isinstance(old, bool):
            changed[key] = not old
        elif isinstance(old, str):
            changed[key] = f"{old}-other"
        else:  # a number, or None (epochs)
            changed[key] = 2.5 if old is None else old * 2 + 1
        differs = {f.name for f in dataclasses.fields(RLSettings)
                   if getattr(RLSettings.from_config(changed), f.name) != getattr(base, f.name)}  # fmt: skip
        assert differs == {key}, f"rl.{key} changed {differs}"
    assert isinstance(base.lr, float) and isinstance(base.steps, int) and isinstance(base.buffer.sft_lr, float)
    partial = json.loads(json.dumps(CONFIG["rl"]))
    del partial["warmup_steps"]
    with pytest.raises(DataError, match=r"missing RL setting rl\.warmup_steps"):
        RLSettings.from_config(partial)
    del partial["buffer"]["sft_lr"]
    partial["warmup_steps"] = 0
    with pytest.raises(DataError, match=r"rl\.buffer\.sft_lr"):
        RLSettings.from_config(partial)
    del partial["keep_checkpoints"]
    partial["buffer"]["sft_lr"] = 1e-3
    with pytest.raises(DataError, match=r"rl\.keep_checkpoints"):
        RLSettings.from_config(partial)


def test_a_run_closes_the_engine_it_started_and_not_one_it_was_given(
    small_world: Path, base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine run_rl starts gives its memory back when the run ends (vLLM's weights and KV
    cache: a second engine in the process would otherwise sit beside the first); a caller's engine
    stays the caller's."""
    from meml.training import rl

    data = small_world / "data/gsm8k"
    closed: list[str] = []

    class Closing(ScriptedEngine):
        def close(self) -> None:
            closed.append(self.name)

    def make(name: str) -> Any:
        engine = scripted_engine(base_model, data)
        engine.__class__ = Closing
        engine.name = name  # type: ignore[attr-defined]
        return engine

    monkeypatch.setattr(rl, "make_engine", lambda *args, **kwargs: make("started"))
    method = Method.from_config("m", METHODS["MoE-SFT-GRPO"])
    train(tiny_settings(steps=1), method, base_model, data, small_world / "experts/gsm8k", tmp_path / "a")
    train(tiny_settings(steps=1), method, base_model, data, small_world / "experts/gsm8k", tmp_path / "b",
          engine=make("given"))  # fmt: skip
    assert closed == ["started"]
