"""GGUF checkpoints (llama.cpp's format), converted once into a checkpoint directory the engine reads.

A GGUF file carries the weights (often quantized), the model's hyperparameters and its
tokenizer as metadata. The first load dequantizes every tensor to float32 and writes a
Hugging Face-style directory (config.json, tokenizer.json, tokenizer_config.json,
generation_config.json, model.safetensors) under the cache, keyed by the file's SHA-256;
later loads find it there. The file is read by engine.model.gguf_file (header, metadata and tensor
table over a memory map) and dequantized with the `gguf` package, llama.cpp's own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tqdm import tqdm

from engine.errors import GGUFError
from engine.model.gguf_file import GGUFFile
from engine.model.quant import PACKED_TYPES, QUANTIZED_FILE, Format, format_to_str, pack

logger = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
# Bump whenever the converted files would change for the same GGUF, so stale caches are never reused.
# v3: quantized tensors also packed for the kernels (quantized.safetensors); v4: the projections a
# layer fuses (q/k/v, gate/up) packed as one tensor each (FUSED_GROUPS).
CONVERTER_VERSION = "gguf-v4"
# Projections the Llama family runs as one matmul, in the model's row order. Stored packed as one
# tensor each, the loader serves a fused layer straight from the file's pages (shared by every
# process that maps it) instead of concatenating copies of its parts at every start.
FUSED_GROUPS = {"self_attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                "mlp.gate_up": ("mlp.gate_proj", "mlp.up_proj")}

# The dequantizers of the gguf package this converter accepts (K-quants included).
SUPPORTED_TENSOR_TYPES = (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
)
# GGUF architecture -> Hugging Face architecture of the same decoder.
SUPPORTED_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}

# llama.cpp token types (llama_token_type in its vocabulary).
_CONTROL, _USER_DEFINED = 3, 4

# The pre-tokenizer split each `tokenizer.ggml.pre` name stands for, where it is not GPT-2's own.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.").
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def is_gguf(path: Path) -> bool:
    return path.suffix.lower() == GGUF_SUFFIX


def find_gguf(path: Path) -> Path | None:
    """The GGUF file `path` names: the file itself, or the one .gguf file in a directory."""
    if path.is_file():
        return path if is_gguf(path) else None
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.is_file() and is_gguf(p))
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise GGUFError(f"{path} holds several GGUF files ({names}); pass the path of one")
    return found[0] if found else None


def ensure_converted(gguf_file: Path, cache_dir: Path, progress: bool = True) -> Path:
    """The converted checkpoint directory for `gguf_file`, converting it on first use."""
    digest = _file_sha256(gguf_file)
    models_dir = cache_dir / "models"
    target = models_dir / f"{CONVERTER_VERSION}-{digest[:32]}"
    if (target / "model.safetensors").is_file():
        logger.info("using the converted checkpoint of %s from %s", gguf_file.name, target)
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    # Convert beside the target and rename it into place, so a half-written checkpoint is never visible.
    staging = models_dir / f".{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        start = time.monotonic()
        logger.info("converting %s (first use; later starts reuse the result)", gguf_file.name)
        convert_gguf(gguf_file, staging, progress=progress)
        try:
            os.replace(staging, target)
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
            # Another process finished first; its files are identical, so keep them.
        logger.info("converted %s in %.1f s", gguf_file.name, time.monotonic() - start)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def convert_gguf(gguf_file: Path, out_dir: Path, progress: bool = True) -> None:
    reader = _open(gguf_file)
    meta = _Metadata(reader, gguf_file.name)
    tensors = {t.name: t for t in reader.tensors}
    config = model_config(meta, tensors)
    tokenizer, tokenizer_config, generation_config = tokenizer_files(meta)
    if tokenizer.get_vocab_size() != config["vocab_size"]:
        raise GGUFError(
            f"{gguf_file.name}: the tokenizer has {tokenizer.get_vocab_size()} tokens, "
            f"the model's vocabulary {config['vocab_size']}"
        )
    weights, packed, formats = {}, {}, {}
    bar = tqdm(
        tensors.values(), desc=f"converting {gguf_file.name}", unit="tensor", file=sys.stderr, disable=not progress
    )
    for tensor in bar:
        name = hf_tensor_name(tensor.name, gguf_file.name)
        weights[name] = _dequantize(tensor, config, gguf_file.name)
        if tensor.tensor_type.name in PACKED_TYPES and len(tensor.shape) == 2:
            codes, scales, mins, fmt = _pack(tensor, config)
            packed.update({f"{name}.codes": codes, f"{name}.scales": scales, f"{name}.mins": mins})
            formats[name] = format_to_str(fmt, int(tensor.shape[0]), tensor.tensor_type.name)
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config)
    _write_json(out_dir / "generation_config.json", generation_config)
    (out_dir / "tokenizer.json").write_text(tokenizer.to_str(pretty=True), encoding="utf-8", newline="\n")
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt", "source": gguf_file.name})
    if packed:
        fused = _fuse(packed, formats, config["num_hidden_layers"])
        save_file(packed, str(out_dir / QUANTIZED_FILE),
                  metadata={"format": "pt", "source": gguf_file.name, "formats": json.dumps(formats, sort_keys=True),
                            "fused": json.dumps(fused, sort_keys=True)})


def _fuse(packed: dict[str, torch.Tensor], formats: dict[str, str], layers: int) -> dict[str, list[str]]:
    """Replace, in packed, each layer's FUSED_GROUPS members by one tensor of their rows in order,
    where all are packed in one format (a Q4_K_M file may pack v apart); returns group -> members."""
    fused = {}
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        for group, parts in FUSED_GROUPS.items():
            members = [f"{prefix}{part}.weight" for part in parts]
            if any(m not in formats for m in members) or len({formats[m] for m in members}) != 1:
                continue
            for field in ("codes", "scales", "mins"):
                packed[f"{prefix}{group}.{field}"] = torch.cat([packed.pop(f"{m}.{field}") for m in members])
            fused[f"{prefix}{group}"] = members
    return fused


def model_config(meta: _Metadata, tensors: dict[str, Any]) -> dict[str, Any]:
    """A Hugging Face config.json for the decoder the metadata describes."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise GGUFError(f"{meta.source}: unsupported GGUF architecture {arch!r}; supported: {supported}")
    hidden = meta.require(f"{arch}.embedding_length")
    heads = meta.require(f"{arch}.attention.head_count")
    head_dim = meta.get(f"{arch}.attention.key_length", hidden // heads)
    rope_dims = meta.get(f"{arch}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise GGUFError(f"{meta.source}: partial rotary embeddings ({rope_dims} of {head_dim} dims) are not supported")
    if "rope_freqs.weight" in tensors:
        raise GGUFError(f"{meta.source}: per-frequency RoPE factors (rope_freqs.weight) are not supported")
    config: dict[str, Any] = {
        "architectures": [SUPPORTED_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": meta.get(f"{arch}.vocab_size", len(meta.require("tokenizer.ggml.tokens"))),
        "hidden_size": hidden,
        "intermediate_size": meta.require(f"{arch}.feed_forward_length"),
        "num_hidden_layers": meta.require(f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta.get(f"{arch}.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": meta.require(f"{arch}.context_length"),
        "rms_norm_eps": meta.require(f"{arch}.attention.layer_norm_rms_epsilon"),
        "rope_theta": meta.get(f"{arch}.rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": meta.require(f"{arch}.rope.scaling.factor")}
    elif scaling != "none":
        raise GGUFError(f"{meta.source}: unsupported RoPE scaling {scaling!r}; supported: none, linear")
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
    return config


def tokenizer_files(meta: _Metadata) -> tuple[tokenizers.Tokenizer, dict[str, Any], dict[str, Any]]:
    """The tokenizer, tokenizer_config.json and generation_config.json the metadata describes.

    Byte-level BPE ("gpt2", as Llama 3, Qwen2 and SmolLM use), built the way transformers builds
    it from the same metadata: GPT-2's byte-level pipeline, the split of the named pre-tokenizer,
    control tokens as special added tokens and user-defined tokens as plain added tokens.
    """
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{meta.source}: unsupported GGUF tokenizer {kind!r}; supported: 'gpt2' (byte-level BPE)")
    tokens: list[str] = meta.require("tokenizer.ggml.tokens")
    types: list[int] = meta.get("tokenizer.ggml.token_type", [])
    merges = [tuple(m.split(" ", 1)) for m in meta.require("tokenizer.ggml.merges")]
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        # A byte-level vocabulary spells every real token in its byte alphabet.
        vocab.setdefault(token if set(token) <= alphabet else _byte_spelling(token), index)
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    split = _PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre", "default"))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    backend.decoder = decoders.ByteLevel()
    # A token marked control but spelled outside the byte alphabet is a mislabel; adding it would grow the vocabulary.
    control = [t for t, kind in zip(tokens, types) if kind == _CONTROL and set(t) <= alphabet]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user_defined = [t for t, kind in zip(tokens, types) if kind == _USER_DEFINED and t in vocab]
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user_defined])

    special = {
        name: tokens[i]
        for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                          ("pad_token", "padding"))
        if (i := meta.get(f"tokenizer.ggml.{key}_token_id")) is not None and 0 <= i < len(tokens)
    }
    for token in special.values():  # as transformers does: named special tokens are always special
        if backend.token_to_id(token) is None or token not in control:
            backend.add_special_tokens([AddedToken(token, normalized=False, special=True)])
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    if add_bos or add_eos:
        single = " ".join(([special["bos_token"]] if add_bos else []) + ["$A"]
                          + ([special["eos_token"]] if add_eos else []))
        used = {special[n] for n, on in (("bos_token", add_bos), ("eos_token", add_eos)) if on}
        backend.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[(t, backend.token_to_id(t)) for t in sorted(used)]
        )
    tokenizer_config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", **special}
    if (template := meta.get("tokenizer.chat_template")) is not None:
        tokenizer_config["chat_template"] = template
    generation_config = {
        key: meta.get(f"tokenizer.ggml.{gguf_key}")
        for key, gguf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                              ("pad_token_id", "padding_token_id"))
        if meta.get(f"tokenizer.ggml.{gguf_key}") is not None
    }
    # Chat models end a turn with a control token that is not the EOS token (ChatML's <|im_end|>).
    if (eot := meta.get("tokenizer.ggml.eot_token_id")) is not None and "eos_token_id" in generation_config:
        generation_config["eos_token_id"] = sorted({generation_config["eos_token_id"], eot})
    return backend, tokenizer_config, generation_config


def hf_tensor_name(name: str, source: str) -> str:
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    prefix, _, rest = name.partition(".")
    layer, _, suffix = rest.partition(".")
    if prefix == "blk" and layer.isdigit() and suffix in _LAYER_TENSORS:
        return f"model.layers.{int(layer)}.{_LAYER_TENSORS[suffix]}"
    raise GGUFError(f"{source}: unexpected tensor {name!r}: the engine's decoder has no place for it")


def _dequantize(tensor: Any, config: dict[str, Any], source: str) -> torch.Tensor:
    import gguf

    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TENSOR_TYPES:
        raise GGUFError(
            f"{source}: tensor {tensor.name!r} has type {kind}, which the engine cannot dequantize; "
            f"supported: {', '.join(SUPPORTED_TENSOR_TYPES)}"
        )
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dimensions innermost first
    # A copy: F32/F16 tensors come back as read-only views of the memory-mapped file.
    values = np.array(gguf.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
    if (order := _row_order(tensor, config)) is not None:
        values = values[order]
    return torch.from_numpy(np.ascontiguousarray(values))


def _pack(tensor: Any, config: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Format]:
    rows, cols = (int(d) for d in reversed(tensor.shape))
    codes, scales, mins, fmt = pack(tensor.tensor_type.name, tensor.data, rows, cols)
    if (order := _row_order(tensor, config)) is not None:
        codes, scales, mins = codes[order], scales[order], mins[order]
    as_tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in (codes, scales, mins)]
    return as_tensors[0], as_tensors[1], as_tensors[2], fmt


def _row_order(tensor: Any, config: dict[str, Any]) -> np.ndarray | None:
    """Where each row of the Hugging Face tensor comes from, where llama.cpp reorders them; else None."""
    if config["model_type"] != "llama" or not tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
        return None
    # llama.cpp stores Llama's q/k rows interleaved for its RoPE kernel; undo that permutation.
    heads = config["num_attention_heads" if "attn_q" in tensor.name else "num_key_value_heads"]
    rows = int(tensor.shape[-1])
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(rows)


class _Metadata:
    """The key-value metadata of a GGUF file, decoded on access."""

    def __init__(self, reader: GGUFFile, source: str) -> None:
        self._fields = reader.fields
        self.source = source

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except (ValueError, UnicodeDecodeError, IndexError) as exc:
            raise GGUFError(f"{self.source}: metadata {key!r} cannot be read ({type(exc).__name__})") from None

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise GGUFError(f"{self.source}: metadata {key!r} is missing")
        return value


def _open(gguf_file: Path) -> GGUFFile:
    try:
        return GGUFFile(gguf_file)
    except (ValueError, OSError, KeyError, IndexError, TypeError, struct.error) as exc:
        # Truncated files, bad magic or versions and unknown tensor types are ValueError from the reader.
        raise GGUFError(f"{gguf_file.name} is not a readable GGUF file: {exc}") from None


def _byte_spelling(token: str) -> str:
    spelling = _BYTE_SPELLING
    return "".join(spelling[b] for b in token.encode("utf-8"))


def _byte_to_unicode() -> dict[int, str]:
    # GPT-2's byte alphabet: printable bytes stand for themselves, the rest map past U+0100 in order.
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_SPELLING = _byte_to_unicode()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8", newline="\n")
