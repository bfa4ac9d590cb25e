"""The vLLM rollout engine: vLLM colocated in the training process, on the same GPU.

vLLM holds its own copy of the policy in the run's compute dtype (bf16 on GPU) and takes a share
of the GPU's memory (`rl.vllm.gpu_memory_utilization`); the policy's weights are pushed into it
after every optimiser step (`sync_weights`), and the loop checks that they arrived
(rollout.check_synced). Sampling settings come from the same `Sampling` as the HF engine's
(rollout.vllm_sampling_kwargs).

vLLM is an optional GPU extra (`pip install -e .[gpu]`: vllm 0.33, which pins torch 2.14.0 and
transformers below 5.21). Importing this module never imports vLLM; building the engine without
it raises a clear error. Untested on hardware in this repository so far: see the README.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meml.core.io import DataError
from meml.core.precision import Precision
from meml.core.stops import stop_tokens
from meml.training.rollout import Completion, Sampling, vllm_sampling_kwargs, weights_fingerprint

INSTALL_HINT = (
    "the vllm engine needs vLLM, a GPU-only extra: `pip install -e .[gpu]` on a CUDA machine "
    "(or set rl.engine / eval.backend to hf)"
)


def require_vllm() -> Any:
    """The vllm module, or a DataError that says how to get it."""
    try:
        import vllm
    except ImportError as err:
        raise DataError(INSTALL_HINT, None, None, "rl.engine") from err
    return vllm


def llm_kwargs(model_dir: str | Path, precision: Precision, settings: dict[str, Any], seed: int) -> dict[str, Any]:
    """Arguments of vllm.LLM: the run's dtype (never vLLM's own choice), its share of the GPU, and
    the external launcher, so that vLLM joins the process group accelerate started."""
    if precision.device != "cuda":
        raise DataError("the vllm engine runs on cuda only", None, None, "device")
    vllm_settings = settings["vllm"]  # rl.vllm
    return {
        "model": str(model_dir),
        "dtype": precision.dtype,
        "gpu_memory_utilization": float(vllm_settings["gpu_memory_utilization"]),
        "max_model_len": int(vllm_settings["max_model_len"]),
        "seed": seed,
        "enable_prefix_caching": True,
        "distributed_executor_backend": "external_launcher",
    }


class VLLMEngine:
    def __init__(
        self, model_dir: str | Path, tokenizer: Any, precision: Precision, settings: dict[str, Any], seed: int
    ) -> None:
        vllm = require_vllm()
        # vLLM's external launcher reads the process group from these (set by accelerate/torchrun)
        for key, default in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(key, default)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model lives in this process
        self.llm = vllm.LLM(**llm_kwargs(model_dir, precision, settings, seed))
        self.tokenizer = tokenizer
        self.dtype = precision.dtype
        self.stops = stop_tokens(tokenizer)

    def _model(self) -> Any:
        return self.llm.llm_engine.model_executor.driver_worker.model_runner.model

    def sync_weights(self, model: Any) -> None:
        """Push every tensor of the policy into vLLM's copy, then drop its prefix cache (the cached
        keys and values were computed with the old weights)."""
        target = self._model()
        for name, tensor in model.state_dict().items():
            target.load_weights([(name, tensor.detach())])
        self.llm.reset_prefix_cache()

    def fingerprint(self) -> tuple[float, float]:
        return weights_fingerprint(self._model().named_parameters(), self.dtype)

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int | Sequence[int], sampling: Sampling
    ) -> list[list[Completion]]:
        vllm = require_vllm()
        counts = [n] * len(prompts) if isinstance(n, int) else list(n)
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        params = [vllm.SamplingParams(**vllm_sampling_kwargs(sampling, k, self.stops.ids)) for k in counts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        result = []
        for out in outputs:
            group = []
            for choice in out.outputs:
                tokens = list(choice.token_ids)
                finished = choice.finish_reason == "stop"
                if finished and (not tokens or tokens[-1] not in self.stops.ids):
                    tokens.append(self.stops.end_of_turn)  # as the HF engine: a finished turn ends with its stop
                group.append(Completion(tokens, self.tokenizer.decode(tokens, skip_special_tokens=True), finished))
            result.append(group)
        return result

    def prompt_logprobs(self, ids: Sequence[int]) -> list[float]:
        """log p of each token of `ids` after the first, under vLLM's current weights."""
        vllm = require_vllm()
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        out = self.llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)[0]
        return [float(step[token].logprob) for token, step in zip(ids[1:], out.prompt_logprobs[1:], strict=True)]
