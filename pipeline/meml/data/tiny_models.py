"""Tiny local models that stand in for the paper's two models; nothing is downloaded.

    tokenizer  byte-level BPE trained with the `tokenizers` library on the toy corpora, with
               Qwen2's pre-tokenisation pattern (digits one by one), a ChatML chat template whose
               assistant turns are marked for assistant-only loss, eos <|im_end|>, pad <|endoftext|>.
               The same tokenizer is saved into both model folders.
    qwen2      a randomly initialised Qwen2 model (stand-in for Qwen2.5-Math-1.5B)
    llama      a smaller randomly initialised Llama model (stand-in for the weaker Llama-3.2-1B-Instruct)

Both folders load with AutoTokenizer / AutoModelForCausalLM under HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from meml.core.io import DataError

QWEN2_PRETOKENIZE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Llama-3.2-Instruct's shape: header tokens, turns closed by <|eot_id|>, and a system header the
# template writes itself ahead of the system prompt.
LLAMA_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
LLAMA_CHAT_TEMPLATE = (
    "{{- '<|begin_of_text|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['role'] == 'system' %}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' }}"
    "{%- endif %}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] + '<|eot_id|>' }}{% endgeneration %}"
    "{%- else %}"
    "{{- message['content'] + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
# SmolLM2-Instruct's shape (its GGUF file's template, config/real-model.yaml): ChatML without
# {% generation %} marks (SFT must find the assistant's tokens another way), a default system prompt
# written when the conversation has none, and pad = eos = <|im_end|> (padding must not hide the end of
# a turn from the loss).
SMOLLM2_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Tokenizer styles: `toy` (eos = the end-of-turn token), and two shaped like the paper's models in
# the ways that break things: `qwen-base` (eos <|endoftext|>, turns end with <|im_end|>) and
# `llama-instruct` (eos <|end_of_text|>, turns end with <|eot_id|>, a template-written system header),
# and `smollm2-instruct` (above).
TOKENIZER_STYLES: dict[str, dict[str, Any]] = {
    "toy": {"special": SPECIAL_TOKENS, "eos": "<|im_end|>", "pad": "<|endoftext|>", "template": CHAT_TEMPLATE},
    "qwen-base": {"special": SPECIAL_TOKENS, "eos": "<|endoftext|>", "pad": "<|endoftext|>", "template": CHAT_TEMPLATE},
    "smollm2-instruct": {
        "special": SPECIAL_TOKENS,
        "eos": "<|im_end|>",
        "pad": "<|im_end|>",
        "template": SMOLLM2_CHAT_TEMPLATE,
    },
    "llama-instruct": {
        "special": LLAMA_SPECIAL_TOKENS,
        "eos": "<|end_of_text|>",
        "pad": "<|end_of_text|>",
        "template": LLAMA_CHAT_TEMPLATE,
    },
}

# Architectures: small enough to train on two CPU cores in minutes; the Llama stand-in is the weaker.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 128,
        "intermediate_size": 352,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
    "llama": {
        "model_type": "llama",
        "hidden_size": 96,
        "intermediate_size": 256,
        "num_hidden_layers": 3,
        # head size 32: vLLM's CPU attention runs head sizes 32, 64, 80, ... (4 heads of 24 it refuses)
        "num_attention_heads": 3,
        "num_key_value_heads": 1,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
}


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 2048, style: str = "toy", pad_to: int = 0) -> Any:
    """A byte-level BPE tokenizer wrapped as a transformers fast tokenizer (`style`: TOKENIZER_STYLES).
    `pad_to`: ids up to this many, the ones training did not fill named `<unused{id}>` (plain
    vocabulary that text never tokenizes to): a random model of a real vocabulary (151,936 ids for
    Qwen2.5) then samples only ids the tokenizer can decode, as a real model's tokenizer can."""
    if style not in TOKENIZER_STYLES:
        raise DataError(f"unknown tokenizer style '{style}'; known: {', '.join(TOKENIZER_STYLES)}")
    spec = TOKENIZER_STYLES[style]
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=spec["special"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    if pad_to > tok.get_vocab_size():
        import json

        spec_json = json.loads(tok.to_str())
        vocab = spec_json["model"]["vocab"]
        vocab.update({f"<unused{i}>": i for i in range(tok.get_vocab_size(), pad_to)})
        tok = Tokenizer.from_str(json.dumps(spec_json))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=spec["eos"],
        pad_token=spec["pad"],
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    fast.chat_template = spec["template"]
    return fast


def build_model(kind: str, tokenizer: Any, seed: int) -> Any:
    if kind not in ARCHITECTURES:
        raise DataError(f"unknown tiny model '{kind}'; known: {', '.join(ARCHITECTURES)}")
    return model_from_architecture(ARCHITECTURES[kind], tokenizer, seed)


def model_from_architecture(arch: dict[str, Any], tokenizer: Any, seed: int) -> Any:
    """A randomly initialised fp32 model of `arch` (model_type plus config fields) for `tokenizer`;
    a `vocab_size` in `arch` is kept when larger than the tokenizer's (a real model's embedding)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(arch)
    vocab = max(int(spec.pop("vocab_size", 0)), len(tokenizer))
    config = AutoConfig.for_model(
        spec.pop("model_type"),
        vocab_size=vocab,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **spec,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    from meml.core.stops import stop_tokens

    model.generation_config.eos_token_id = list(stop_tokens(tokenizer).ids)  # end of turn and eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_atomically(folder: str | Path, tokenizer: Any, model: Any | None = None) -> None:
    """Save into a temporary folder, then rename: a half-saved model folder never exists."""
    target = Path(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tokenizer.save_pretrained(tmp)
        if model is not None:
            model.save_pretrained(tmp, safe_serialization=True)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def tiny_arch(cfg: dict[str, Any], model: str) -> str | None:
    """`tiny:qwen2` -> "qwen2"; None for a hub id or folder."""
    source = str(cfg["models"][model]["source"])
    return source.split(":", 1)[1] if source.startswith("tiny:") else None


def folder_name(kind: str, style: str = "toy") -> str:
    """The folder of a tiny model: its kind, with the tokenizer style unless it is the toy one."""
    return kind if style == "toy" else f"{kind}-{style}"


def build_tiny_models(
    corpus: Iterable[str],
    out_root: str | Path,
    seed: int,
    vocab_size: int = 2048,
    kinds: Iterable[str] = ("qwen2", "llama"),
    styles: dict[str, str] | None = None,
    pretraining: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """Train a tokenizer on the corpus (one per tokenizer style) and save one random-initialised
    model per kind, in out_root/<folder_name(kind, style)>. `styles`: kind -> style (default toy).
    `pretraining`: {"texts", "steps", "lr", "batch_size"} trains each model on the texts first
    (data/pretrain.py); its losses go to out_root/<folder>/pretrain_losses.json."""
    from meml.core.io import atomic_write_json

    corpus = list(corpus)
    tokenizers: dict[str, Any] = {}
    out = {}
    for kind in kinds:
        style = (styles or {}).get(kind, "toy")
        if style not in tokenizers:
            tokenizers[style] = train_tokenizer(corpus, vocab_size, style)
        name = folder_name(kind, style)
        model = build_model(kind, tokenizers[style], seed)
        losses = None
        if pretraining and pretraining["steps"] > 0:
            from meml.data.pretrain import pretrain

            settings = {k: pretraining[k] for k in ("steps", "lr", "batch_size")}
            losses = pretrain(model, tokenizers[style], pretraining["texts"], seed=seed, **settings)
        save_atomically(Path(out_root) / name, tokenizers[style], model)
        if losses is not None:
            atomic_write_json(Path(out_root) / name / "pretrain_losses.json", {"steps": len(losses), "loss": losses})
        out[name] = Path(out_root) / name
    return out


def toy_corpus(root: str | Path, prompts: Iterable[str], with_experts: bool = True) -> list[str]:
    """Every question, option list, rationale and (with_experts) expert trajectory of a world's
    folder, plus the prompts. The real world's tokenizer is trained before any teacher has
    written, so on its data alone (with_experts=False): the same corpus whatever ran first."""
    from meml.core.io import read_jsonl
    from meml.core.records import DATASETS, read_records
    from meml.data.experts import user_message

    texts = list(prompts)
    root = Path(root)
    for ds in DATASETS:
        data = root / "data" / ds
        if not data.is_dir():
            continue
        for split in ("train", "test"):
            for record in read_records(data / f"{split}.jsonl"):
                texts.append(user_message(record))
                texts.append(record.rationale)
        for path in sorted((root / "experts" / ds).glob("e*.jsonl")) if with_experts else []:
            texts += [row["completion"] for _, row in read_jsonl(path)]
    if len(texts) <= len(list(prompts)):
        raise DataError("no toy data found to train the tokenizer on", root)
    return texts
