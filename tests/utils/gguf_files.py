"""Small GGUF files written with the gguf package's writer, the way llama.cpp's converter lays them out.

Random weights of a tiny Llama or Qwen2 shape, the demo tokenizer's vocabulary and merges in the
metadata, and the tensors stored as F16, Q8_0, Q4_1 (or any type gguf can quantize). The gguf
package cannot quantize to the K-quants; `random_blocks` writes those from random bytes instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

TINY = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "context": 512}
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tokenizer_metadata(tokenizer_dir: Path) -> dict:
    """tokens, token types and merges of a byte-level BPE tokenizer.json, in id order."""
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = dict(data["model"]["vocab"])
    special = {t["content"] for t in data["added_tokens"] if t["special"]}
    for added in data["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    types = [3 if token in special else 1 for token in tokens]  # 3 = control, 1 = normal
    return {"tokens": tokens, "types": types, "merges": merges, "ids": {t: i for i, t in enumerate(tokens)}}


def write_tiny_gguf(
    path: Path, tokenizer_dir: Path, *, arch: str = "llama", qtype: str = "F16", seed: int = 0,
    tied: bool = False, shape: dict | None = None,
) -> Path:
    shape = TINY | (shape or {})
    meta = tokenizer_metadata(tokenizer_dir)
    vocab = len(meta["tokens"])
    hidden, heads, kv_heads = shape["hidden"], shape["heads"], shape["kv_heads"]
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(shape["context"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(shape["layers"])
    writer.add_feed_forward_length(shape["intermediate"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(meta["tokens"])
    writer.add_token_types(meta["types"])
    writer.add_token_merges(meta["merges"])
    writer.add_bos_token_id(meta["ids"]["<|begin_of_text|>"])
    writer.add_eos_token_id(meta["ids"]["<|im_end|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)

    rng = np.random.default_rng(seed)

    def weight(*dims: int, scale: float | None = None) -> np.ndarray:
        bound = scale if scale is not None else 1.0 / np.sqrt(dims[-1])
        return rng.uniform(-bound * 1.7, bound * 1.7, size=dims).astype(np.float32)

    def add(name: str, values: np.ndarray) -> None:
        if values.ndim == 1 or qtype == "F32":  # norms and biases stay F32, as llama.cpp's converter keeps them
            writer.add_tensor(name, values.astype(np.float32))
        elif qtype == "F16":
            writer.add_tensor(name, values.astype(np.float16))
        elif qtype in K_QUANTS:
            kind = gguf.GGMLQuantizationType[qtype]
            scale = float(np.abs(values).mean())
            writer.add_tensor(name, random_blocks(qtype, values.shape[0], values.shape[1], rng, scale), raw_dtype=kind)
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(name, gguf.quantize(values, kind), raw_dtype=kind)

    add("token_embd.weight", weight(vocab, hidden, scale=1.0))
    for i in range(shape["layers"]):
        q = weight(heads * head_dim, hidden)
        k = weight(kv_heads * head_dim, hidden)
        if arch == "llama":  # llama.cpp interleaves Llama's q/k rows for its RoPE kernel
            q, k = _permute(q, heads), _permute(k, kv_heads)
        add(f"blk.{i}.attn_norm.weight", 1 + weight(hidden, scale=0.1))
        add(f"blk.{i}.attn_q.weight", q)
        add(f"blk.{i}.attn_k.weight", k)
        add(f"blk.{i}.attn_v.weight", weight(kv_heads * head_dim, hidden))
        if arch == "qwen2":
            add(f"blk.{i}.attn_q.bias", weight(heads * head_dim, scale=0.1))
            add(f"blk.{i}.attn_k.bias", weight(kv_heads * head_dim, scale=0.1))
            add(f"blk.{i}.attn_v.bias", weight(kv_heads * head_dim, scale=0.1))
        add(f"blk.{i}.attn_output.weight", weight(hidden, heads * head_dim))
        add(f"blk.{i}.ffn_norm.weight", 1 + weight(hidden, scale=0.1))
        add(f"blk.{i}.ffn_gate.weight", weight(shape["intermediate"], hidden))
        add(f"blk.{i}.ffn_up.weight", weight(shape["intermediate"], hidden))
        add(f"blk.{i}.ffn_down.weight", weight(hidden, shape["intermediate"]))
    add("output_norm.weight", 1 + weight(hidden, scale=0.1))
    if not tied:
        add("output.weight", weight(vocab, hidden, scale=5.0 / np.sqrt(hidden)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# Byte offsets of each K-quant block's fp16 super-block scales (d, and dmin where it has one).
_K_SCALE_OFFSETS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(qtype: str, rows: int, cols: int, rng: np.random.Generator, mean_abs: float = 0.05) -> np.ndarray:
    """A rows x cols tensor of `qtype` blocks [rows, bytes per row] from random bytes, its fp16
    super-block scales set so that the dequantized values' mean magnitude is about mean_abs."""
    kind = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    offsets = _K_SCALE_OFFSETS.get(qtype, (0,))

    def set_scales(d: float, dmin: float = 0.0) -> np.ndarray:
        for offset, value in zip(offsets, (d, dmin)):
            blocks[:, offset : offset + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
        return gguf.dequantize(blocks, kind)

    ratio = 0.0
    if len(offsets) == 2:  # w = d * scale * q - dmin * min: a dmin that centres the values on zero
        ratio = float(set_scales(1.0, 0.0).mean()) / -float(set_scales(0.0, 1.0).mean())
    magnitude = float(np.abs(set_scales(1.0, ratio)).mean())
    set_scales(mean_abs / magnitude, ratio * mean_abs / magnitude)
    return blocks.reshape(rows, -1)


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp's convert_hf_to_gguf: each head's rotary halves become interleaved pairs.
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape
    )
