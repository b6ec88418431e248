"""Small random Hugging Face checkpoints written with save_pretrained, for oracle tests.

Random models at the default init scale (0.02) have near-uniform logits: greedy paths
are decided by fp32 noise and collapse into repeating one token. A larger init scale
gives clear top-1/top-2 margins and varied tokens; tests check both on the oracle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TOKENIZER_TEXT = [
    "The gateway verifies every token, asks policy for a decision and hands the request to the engine.",
    "Paged KV blocks are reference counted; a free list holds the rest of the pool.",
    "Continuous batching lets requests join and leave between steps.",
] * 20


def write_tokenizer(path: Path, vocab_size: int) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "</s>"],
        show_progress=False,
    )
    tok.train_from_iterator(TOKENIZER_TEXT, trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


def write_checkpoint(
    path: Path,
    arch: str = "llama",
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = False,
    rope_parameters: dict | None = None,
    init_std: float = 0.3,
    seed: int = 0,
    max_shard_size: str | None = None,
) -> Path:
    """Write a random checkpoint of the given family into path and return path."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
    }
    config_cls, model_cls = classes[arch]
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=init_std,
        bos_token_id=0,
        # No EOS: greedy runs a fixed number of steps in both engines (tests set ignore_eos).
        eos_token_id=None,
    )
    if rope_parameters is not None:
        kwargs["rope_parameters"] = rope_parameters
    config = config_cls(**kwargs)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):  # zero-initialised by HF: make the QKV bias matter
                param.normal_(0.0, init_std)
            elif "norm" in name:
                param.uniform_(0.8, 1.2)
    path.mkdir(parents=True, exist_ok=True)
    save_kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **save_kwargs)
    write_tokenizer(path, vocab_size)
    return path


def load_reference(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.no_grad()
def reference_greedy(model, prompt: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """HF greedy continuation of one prompt: (new token ids, [steps, vocab] logits)."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    tokens = out.sequences[0, len(prompt) :].tolist()
    return tokens, torch.stack(out.logits)[:, 0].float()
