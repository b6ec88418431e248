"""A Llama-family decoder (Llama 2/3, Mistral, Qwen2) over a paged KV cache.

q/k/v and gate/up projections are fused into one matmul each; the loader fills the
fused weights from the checkpoint's separate tensors.

Where the quantized-weight kernels are loaded (CPU), the loader also turns on their small
ops (LlamaForCausalLM.use_cpu_kernels) for steps of at most KERNEL_OPS_MAX_ROWS rows outside
the deterministic lane: the residual add with each RMSNorm, rotary in place, SiLU times up,
and decode attention over the pool each run as one op instead of a dozen PyTorch ops whose
dispatch dominated a one-row step (docs/engine.md, "Quantized weights"). Wider steps, the
deterministic lane, CUDA and dequantized weights run the eager ops below, which are faster
once there are rows enough to vectorize over.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.model.attention import AttentionMetadata, paged_attention
from engine.model.invariant import RowFn, apply_rows
from engine.model.rope import RotaryEmbedding, apply_rotary


class Linear(nn.Linear):
    """nn.Linear without its random initialisation: every weight is loaded from the checkpoint
    (the loader refuses one that is missing), and initialising SmolLM2's 135M parameters only to
    overwrite them took about 3 s of each start."""

    def reset_parameters(self) -> None:
        pass


class Embedding(nn.Embedding):
    """nn.Embedding without its random initialisation, for the same reason."""

    def reset_parameters(self) -> None:
        pass


def _kernels():
    return torch.ops.tenantgate_quant


# The widest step that runs the CPU kernels' small ops: a decode, or a draft's verification (at
# most 4 rows: engine/speculation.py), so a draft row gets a one-token step's bits; the quantized
# projections change path above 4 rows too (quant.BF16_MIN_ROWS).
KERNEL_OPS_MAX_ROWS = 4


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and scale after casting back, as the reference implementation does.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def add_forward(self, x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """x += delta in place (when given), then the norm of x, in one op (CPU kernels only)."""
        return _kernels().rms_norm(x, delta, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.o_bias)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],  # RotaryEmbedding.tables() of the step's positions
        meta: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        kernels: bool = False,  # rotary and attention by the CPU kernels (LlamaForCausalLM.forward decides)
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = apply_rows(self.qkv_proj, x, meta.row_sizes)
        if kernels:
            _kernels().rotary_(qkv, rope[0], rope[1], self.num_heads + self.num_kv_heads, self.head_dim)
            q = qkv[:, : self.q_size].view(num_tokens, self.num_heads, self.head_dim)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(num_tokens, self.num_kv_heads, self.head_dim)
            v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
            out = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, cpu_kernels=True)
            return apply_rows(self.o_proj, out.reshape(num_tokens, self.q_size), meta.row_sizes)
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = apply_rotary(qk.view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim), rope)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return apply_rows(self.o_proj, out.reshape(num_tokens, self.q_size), meta.row_sizes)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, rope, meta, kv_cache):
        x = x + self.self_attn(apply_rows(self.input_layernorm, x, meta.row_sizes), rope, meta, kv_cache)
        return x + apply_rows(self._mlp_block, x, meta.row_sizes)

    def _mlp_block(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.post_attention_layernorm(x))

    def add_forward(self, x, delta, rope, meta, kv_cache) -> tuple[torch.Tensor, torch.Tensor]:
        """forward(x + delta) by the CPU kernels' ops, as (x + delta + attention, MLP output): the
        stream x updated in place and the MLP's output left for the next norm to add. Each add is
        the one forward() makes (the same rounding); every op works row by row."""
        h = self.input_layernorm.add_forward(x, delta)
        h = self.post_attention_layernorm.add_forward(x, self.self_attn(h, rope, meta, kv_cache, kernels=True))
        return x, self.mlp.down_proj(_kernels().silu_mul(self.mlp.gate_up_proj(h)))


class LlamaForCausalLM(nn.Module):
    cpu_kernels = False

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, max_positions)
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary.tables(positions, x.dtype)
        if self._kernel_step(x, meta):
            x = x.contiguous()  # the residual stream, updated in place
            delta: torch.Tensor | None = None  # the last MLP's output, which the next norm adds
            for decoder, kv_cache in zip(self._decoder_layers(), kv_caches):
                x, delta = decoder.add_forward(x, delta, rope, meta, kv_cache)
            return self.norm.add_forward(x, delta)
        for layer, kv_cache in zip(self.layers, kv_caches):
            x = layer(x, rope, meta, kv_cache)
        return apply_rows(self.norm, x, meta.row_sizes)

    def compute_logits(self, hidden: torch.Tensor, row_sizes: tuple[int, ...] | None = None) -> torch.Tensor:
        return apply_rows(self.lm_head, hidden, row_sizes).float()

    def _kernel_step(self, x: torch.Tensor, meta: AttentionMetadata) -> bool:
        """Whether this step runs the CPU kernels' small ops: on, a few rows, not the deterministic lane
        (its row-wise work runs on calls of its own sizes), no gradients wanted (the ops have none)."""
        return (self.cpu_kernels and x.shape[0] <= KERNEL_OPS_MAX_ROWS and meta.row_sizes is None
                and (torch.is_inference_mode_enabled() or not torch.is_grad_enabled()))

    def use_cpu_kernels(self) -> bool:
        """Run the small ops through the quantized-weight kernels (engine/model/kernels, loaded by the
        caller) where they serve this model: on CPU, in float32 or bfloat16. Returns whether they do."""
        norm = self.norm.weight
        if norm.device.type != "cpu" or norm.dtype not in (torch.float32, torch.bfloat16):
            return False
        self.cpu_kernels = True
        return True

    def row_functions(self) -> list[tuple[RowFn, int]]:
        """Each row-wise function forward() runs, with its input width (every layer has the same shapes)."""
        layer, cfg = self._decoder_layers()[0], self.config
        return [
            (layer.input_layernorm, cfg.hidden_size),
            (layer.self_attn.qkv_proj, cfg.hidden_size),
            (layer.self_attn.o_proj, layer.self_attn.q_size),
            (layer._mlp_block, cfg.hidden_size),
            (self.norm, cfg.hidden_size),
        ]

    def _decoder_layers(self) -> list[DecoderLayer]:
        # A ModuleList's items are plain Modules to a type checker; these are DecoderLayers.
        return cast("list[DecoderLayer]", list(self.layers))

    def checkpoint_tensors(self) -> dict[str, tuple[torch.Tensor, int, int]]:
        """HF tensor name -> (parameter, first row, row count) it fills (fused weights take slices)."""
        cfg = self.config
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        inter = cfg.intermediate_size
        out: dict[str, tuple[torch.Tensor, int, int]] = {
            "model.embed_tokens.weight": (self.embed_tokens.weight, 0, cfg.vocab_size),
            "model.norm.weight": (self.norm.weight, 0, cfg.hidden_size),
        }
        if not cfg.tie_word_embeddings:
            out["lm_head.weight"] = (self.lm_head.weight, 0, cfg.vocab_size)
        for i, layer in enumerate(self._decoder_layers()):
            p = f"model.layers.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            slices = {"q_proj": (0, q), "k_proj": (q, kv), "v_proj": (q + kv, kv)}
            for name, (start, rows) in slices.items():
                out[f"{p}self_attn.{name}.weight"] = (attn.qkv_proj.weight, start, rows)
                if cfg.qkv_bias:
                    out[f"{p}self_attn.{name}.bias"] = (attn.qkv_proj.bias, start, rows)
            out[f"{p}self_attn.o_proj.weight"] = (attn.o_proj.weight, 0, cfg.hidden_size)
            if cfg.o_bias:
                out[f"{p}self_attn.o_proj.bias"] = (attn.o_proj.bias, 0, cfg.hidden_size)
            for name, start in (("gate_proj", 0), ("up_proj", inter)):
                out[f"{p}mlp.{name}.weight"] = (mlp.gate_up_proj.weight, start, inter)
                if cfg.mlp_bias:
                    out[f"{p}mlp.{name}.bias"] = (mlp.gate_up_proj.bias, start, inter)
            out[f"{p}mlp.down_proj.weight"] = (mlp.down_proj.weight, 0, cfg.hidden_size)
            if cfg.mlp_bias:
                out[f"{p}mlp.down_proj.bias"] = (mlp.down_proj.bias, 0, cfg.hidden_size)
            out[f"{p}input_layernorm.weight"] = (layer.input_layernorm.weight, 0, cfg.hidden_size)
            out[f"{p}post_attention_layernorm.weight"] = (layer.post_attention_layernorm.weight, 0, cfg.hidden_size)
        return out
