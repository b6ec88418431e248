"""Engine and model configuration, validated once and never mutated afterwards."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ConfigError

# HF architecture name -> the variant of our decoder that implements it.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
WEIGHTS_MODES = ("auto", "quantized", "dequantized")


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ModelConfig:
    """The numerics-relevant part of a Hugging Face config.json."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeConfig
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    sliding_window: int | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["rope"] = self.rope.as_dict()
        return d

    @classmethod
    def from_dir(cls, path: Path) -> ModelConfig:
        config_path = path / "config.json"
        try:
            raw = json.loads(config_path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{config_path} not found: a checkpoint directory needs a config.json") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{config_path} is not valid JSON ({type(exc).__name__})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{config_path} must hold a JSON object")
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        try:
            return cls._from_dict(raw)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"config.json has a value of the wrong type ({exc})") from None

    @classmethod
    def _from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        archs = raw.get("architectures") or []
        if isinstance(archs, str):
            archs = [archs]
        arch = archs[0] if archs else _ARCH_BY_MODEL_TYPE.get(raw.get("model_type", ""), raw.get("model_type"))
        if arch not in SUPPORTED_ARCHITECTURES:
            supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
            raise ConfigError(f"unsupported architecture {arch!r}; supported: {supported}")
        variant = SUPPORTED_ARCHITECTURES[arch]
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"unsupported hidden_act {act!r}; supported: 'silu'")

        hidden = _positive_int(raw, "hidden_size")
        heads = _positive_int(raw, "num_attention_heads")
        kv_heads = _positive_int(raw, "num_key_value_heads", default=heads)
        if heads % kv_heads:
            raise ConfigError(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})")
        head_dim = raw.get("head_dim") or hidden // heads
        if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
            raise ConfigError(f"head_dim must be a positive even integer, got {head_dim!r}")

        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        use_window = raw.get("use_sliding_window", variant == "mistral")
        window = raw.get("sliding_window") if use_window else None
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            architecture=arch,
            vocab_size=_positive_int(raw, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_positive_int(raw, "intermediate_size"),
            num_hidden_layers=_positive_int(raw, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=_positive_int(raw, "max_position_embeddings", default=2048),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=_rope_config(raw),
            qkv_bias=variant == "qwen2" or attention_bias,
            o_bias=attention_bias and variant != "qwen2",
            mlp_bias=bool(raw.get("mlp_bias", False)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            sliding_window=int(window) if window else None,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(int(i) for i in eos_ids),
        )


_ARCH_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def _positive_int(raw: dict[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"config.json: {key} must be a positive integer, got {value!r}")
    return value


def _rope_config(raw: dict[str, Any]) -> RopeConfig:
    # transformers < 5 writes rope_theta + rope_scaling; transformers 5 writes rope_parameters.
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    rope = RopeConfig(theta=theta, rope_type=rope_type)
    if rope_type == "default":
        return rope
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model: memory, batching limits, device and dtype.

    kv_cache_memory_bytes sizes the paged KV pool at start-up; on CUDA with
    gpu_memory_utilization set, the pool instead takes what that share of the device leaves
    after the weights and the activations of a warm-up step (engines sharing a device each
    get their own share). num_kv_blocks overrides both (tests use it to force preemption
    with a tiny pool).
    """

    model: str = "demo"
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    kv_cache_memory_bytes: int = 1 << 30
    num_kv_blocks: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    # The step's budget while more than one tenant has work (engine/scheduler.py): what one
    # tenant's long prompt may add to each step of another tenant's request.
    contended_batched_tokens: int = 256
    # ... and what such a step may take in time: the budget shrinks (never below max_num_seqs) until
    # a contended step of prompt tokens takes about this long, from the engine's measured cost per
    # token, so a slow CPU does not turn 256 tokens into a second of every other tenant's wait. 0: off.
    contended_step_ms: float = 250.0
    # A step counts as contended while another tenant had work within this many seconds, so a burst
    # that arrives between a neighbour's requests does not run one whole-budget step ahead of its next.
    contention_window_s: float = 5.0
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    gpu_memory_utilization: float | None = None  # CUDA: the share of device memory the engine may fill
    enforce_eager: bool = False  # CUDA: run decode steps eagerly instead of replaying CUDA graphs
    seed: int = 0
    # Key for the digests in execution records; share it across replicas to compare them.
    # Empty: a random key per process.
    record_key: bytes = b""
    # Structured outputs (engine/grammar_compiler.py): a schema that takes longer to compile is
    # refused; compilations at once (one per tenant); compiled schemas kept, per cache namespace.
    grammar_compile_timeout_s: float = 2.0
    grammar_workers: int = 2
    grammar_cache_size: int = 256
    # GGUF weights: kept quantized and read in place by the CPU kernels (engine/model/quant.py), or
    # dequantized to the dtype. auto: quantized on CPU where the checkpoint has packed weights and
    # the kernels build here, else dequantized (docs/engine.md, "Quantized weights").
    weights: str = "auto"
    # CPU threads for the model; None: the CPUs this process may run on (affinity and cgroup quota).
    threads: int | None = None
    # Prompt-lookup speculation (engine/speculation.py): at most this many draft tokens verified
    # beside a lone decode, for requests whose envelope allows it. 0: never. Three keeps the step
    # at four rows, where the quantized kernels still read codes in place (docs/engine.md).
    num_speculative_tokens: int = 3

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ConfigError(f"dtype must be auto, float32, float16 or bfloat16, got {self.dtype!r}")
        if self.weights not in WEIGHTS_MODES:
            raise ConfigError(f"weights must be one of {', '.join(WEIGHTS_MODES)}, got {self.weights!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                         or self.threads <= 0):
            raise ConfigError(f"threads must be a positive integer, got {self.threads!r}")
        for name in ("block_size", "kv_cache_memory_bytes", "max_num_seqs", "max_num_batched_tokens",
                     "contended_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        for name in ("contended_step_ms", "contention_window_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
                raise ConfigError(f"{name} must be a non-negative number, got {value!r}")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ConfigError(f"num_kv_blocks must be positive, got {self.num_kv_blocks!r}")
        utilization = self.gpu_memory_utilization
        if utilization is not None and (not isinstance(utilization, (int, float)) or not 0 < utilization <= 1):
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        timeout = self.grammar_compile_timeout_s
        if not isinstance(timeout, (int, float)) or not 0 < timeout <= 600:
            raise ConfigError(f"grammar_compile_timeout_s must be in (0, 600], got {self.grammar_compile_timeout_s!r}")
        if not isinstance(self.grammar_workers, int) or self.grammar_workers < 1:
            raise ConfigError(f"grammar_workers must be a positive integer, got {self.grammar_workers!r}")
        if not isinstance(self.grammar_cache_size, int) or self.grammar_cache_size < 0:
            raise ConfigError(f"grammar_cache_size must be a non-negative integer, got {self.grammar_cache_size!r}")
        spec = self.num_speculative_tokens
        if not isinstance(spec, int) or isinstance(spec, bool) or not 0 <= spec <= 16:
            raise ConfigError(f"num_speculative_tokens must be an integer from 0 to 16, got {spec!r}")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ConfigError(f"max_model_len must be positive, got {self.max_model_len!r}")

    def blocks_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)
