"""No job that takes a GPU loads its model onto the CPU while a GPU is configured (simulated: this
machine has none). Each rule that declares `resources: gpu` under `device: cuda` is listed below
with how it is checked; the sampling jobs (calibration, complementarity) run through the `meml`
job functions with `device: cuda` and the model-loading and engine-building functions replaced by
recorders of the device and engine they were asked for."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PROJECT

from meml.core.config import load_config
from meml.core.precision import of_config
from meml.data.experts import DEFAULT_PROMPTS
from meml.training.rollout import Completion

# every rule with a gpu resource, and how its device is checked here
GPU_RULES = {
    "calibrate": "sampling job: test_sampling_jobs_sample_on_the_configured_device",
    "complementarity": "sampling job: test_sampling_jobs_sample_on_the_configured_device",
    "evaluate": "lm-eval on the config's device: test_evaluation_runs_on_the_gpu",
    "evaluate_base": "the same evaluation job",
    "evaluate_sft": "the same evaluation job",
    "evaluate_trl": "the same evaluation job",
    "sft": "trl's Trainer, use_cpu off: test_training_jobs_place_the_model_on_the_gpu",
    "rl": "Dist.from_env(device): test_training_jobs_place_the_model_on_the_gpu",
    "trl_grpo": "Dist.from_env(device), as rl",
    "teacher_trajectories": "a vllm teacher only: vLLM's GPU build places it (data/teachers.py)",
}


def gpu_rules() -> set[str]:
    """The rules whose `resources:` name a gpu, read from the rule files."""
    found = set()
    for path in (PROJECT / "pipeline" / "rules").glob("*.smk"):
        for name, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", path.read_text(), re.M | re.S):
            if re.search(r"resources:\s*\n(\s+\w+=.*\n)*?\s+gpu=", body):
                found.add(name)
    return found


def test_every_gpu_rule_is_checked() -> None:
    assert gpu_rules() == set(GPU_RULES), "a rule takes a GPU: say here how its device is checked"


class Recorded:
    """What the jobs asked for: models loaded (and where each was moved), engines built."""

    def __init__(self) -> None:
        self.models: list[FakeModel] = []
        self.engines: list[tuple[str, str]] = []  # (engine, device its model is on)


class FakeParameter:
    def __init__(self, model: FakeModel) -> None:
        self.model = model

    @property
    def device(self) -> torch.device:
        return torch.device(self.model.where)


class FakeModel:
    def __init__(self) -> None:
        self.where = "cpu"  # from_pretrained loads onto the CPU

    def to(self, device: Any) -> FakeModel:
        self.where = torch.device(device).type
        return self

    def parameters(self) -> Any:
        return iter([FakeParameter(self)])


def _answers(prompts: Any, n: Any) -> list[list[Completion]]:
    counts = [n] * len(prompts) if isinstance(n, int) else list(n)
    return [[Completion([1, 2], "The answer is 7", True) for _ in range(k)] for k in counts]


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    from transformers import AutoModelForCausalLM

    from meml.training import engines, rollout_vllm

    seen = Recorded()

    def from_pretrained(*args: Any, **kwargs: Any) -> FakeModel:
        seen.models.append(FakeModel())
        return seen.models[-1]

    def engine_of(kind: str) -> Any:
        class Engine:
            def __init__(self, model: Any, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
                seen.engines.append((kind, model.where))

            def generate(self, prompts: Any, n: Any, sampling: Any) -> list[list[Completion]]:
                return _answers(prompts, n)

        return Engine

    class VLLM:
        def __init__(self, model_dir: Any, tokenizer: Any, precision: Any, settings: Any, seed: int) -> None:
            seen.engines.append(("vllm", precision.device))  # vLLM loads the weights itself, on its device

        def generate(self, prompts: Any, n: Any, sampling: Any) -> list[list[Completion]]:
            return _answers(prompts, n)

        def close(self) -> None:
            pass

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(engines, "KVEngine", engine_of("kv"))
    monkeypatch.setattr(engines, "HFEngine", engine_of("hf"))
    monkeypatch.setattr(rollout_vllm, "VLLMEngine", VLLM)
    return seen


@pytest.fixture(scope="module")
def model(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder for its tokenizer (the weights are never loaded here)."""
    from meml.data.tiny_models import build_tiny_models, toy_corpus

    out = tmp_path_factory.mktemp("gpu_jobs_models")
    return build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), out, seed=0, vocab_size=500)["qwen2"]


@pytest.mark.parametrize(
    ("device", "engine", "expected"),
    [("cuda", "vllm", "vllm"), ("cuda", "hf", "hf"), ("cuda", "kv", "hf"), ("cpu", "vllm", "kv"), ("cpu", "kv", "kv")],
)
def test_sampling_jobs_sample_on_the_configured_device(
    recorded: Recorded, small_world: Path, model: Path, tmp_path: Path, device: str, engine: str, expected: str
) -> None:
    """Calibration and complementarity under `device: cuda` sample on the GPU: through vLLM when
    rl.engine is vllm (no model loaded in the job's process), else the model moved to the GPU before
    transformers' generate gets it. On a CPU, the kv engine on the CPU, whatever rl.engine is."""
    from meml.jobs import evaluation as jobs

    cfg = load_config(overrides={"device": device, "rl.engine": engine, "calibration.gate": "warn"})
    data = str(small_world / "data")
    jobs.calibrate(cfg, str(model), "gsm8k", [0, 1, 2], str(tmp_path / "calibration.json"), "here", data)
    jobs.complementarity(cfg, [str(model)], "gsm8k", [0, 1, 2], str(tmp_path / "comp" / "gsm8k"), data_root=data,
                         limit=3)  # fmt: skip
    assert recorded.engines == [(expected, device)] * 2
    assert all(m.where == device for m in recorded.models)
    assert len(recorded.models) == (0 if expected == "vllm" else 2)


def test_evaluation_runs_on_the_gpu(model: Path, small_world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every evaluation rule runs jobs.evaluation.evaluate, which hands lm-eval the config's device."""
    from meml.evaluation import evaluate
    from meml.jobs import evaluation as jobs

    asked: list[str] = []
    monkeypatch.setattr(evaluate, "evaluate", lambda *args, **kwargs: asked.append(kwargs["device"]) or {})
    cfg = load_config(overrides={"device": "cuda"})
    jobs.evaluate(cfg, str(model), "gsm8k", [0], "out", data_root=str(small_world / "data"))
    assert asked == ["cuda"]


def test_training_jobs_place_the_model_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """SFT hands trl's Trainer use_cpu = False; RL (and trl's GRPO beside it) moves the policy to
    Dist.from_env(device).device, cuda:0 for a single process."""
    from meml.training.distributed import Dist
    from meml.training.sft import device_settings

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    precision = of_config(load_config(overrides={"device": "cuda"}))
    assert precision.device == "cuda" and device_settings(precision)["use_cpu"] is False
    assert Dist.from_env(precision.device).device == "cuda:0"
