"""The engine's public API: what the gateway, devkit and the benchmarks import (`from engine import
LLMEngine, SamplingParams`); the modules behind it are the engine's own (pyproject.toml's import
contracts keep them so). Three are faces of their own: `engine.remote` (the engine as a network
service: wire format, envelope tokens, server), `engine.cli` (`tenantgate generate`) and
`engine.paths` (the cache directory, which the gateway's dev issuer and audit key use too).

`import engine` is cheap: each name is imported from its module on first use (PEP 562), so
`from engine import ExecutionEnvelope` loads engine/envelope.py and never torch; a gateway module
that needs only the envelope, the sampling parameters or the errors imports no torch through it.
The errors import nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from engine.errors import (
    ConfigError,
    EncoderError,
    EngineDeadError,
    EnvelopeError,
    GGUFError,
    ModelNotFoundError,
    RequestError,
    SamplingParamsError,
    TokenizerError,
    WeightsError,
)

if TYPE_CHECKING:
    from engine.async_engine import AsyncLLMEngine
    from engine.config import EngineConfig
    from engine.encoder import AsyncEncoder, Encoder
    from engine.envelope import (
        MAX_PUBLIC_SEGMENTS,
        CacheScope,
        ExecutionEnvelope,
        Isolation,
        PublicSegment,
        isolation_key,
        keyed_digest,
        local_envelope,
        segment_digest,
        tenant_digest,
    )
    from engine.ids import random_hex, random_uuid
    from engine.llm_engine import LLMEngine
    from engine.model.catalog import (
        DEFAULT_MODEL,
        PACKAGED_ENCODERS,
        PackagedModel,
        packaged_model_file,
        resolve_encoder_path,
        resolve_model_path,
        served_encoder_name,
        served_model_name,
    )
    from engine.outputs import RequestOutput, TokenLogprobs
    from engine.sampling_params import (
        MAX_CHOICES,
        MAX_LOGIT_BIAS,
        MAX_LOGIT_BIAS_TOKENS,
        MAX_PENALTY,
        MAX_TOP_LOGPROBS,
        SamplingParams,
    )
    from engine.telemetry import (
        ListSink,
        PendingRecords,
        PrometheusSink,
        RecordSink,
        RequestRecord,
        StepHistory,
        StepRecord,
    )
    from engine.tokenizer import Tokenizer

# Each lazily imported name, by the module that defines it.
_MODULES = {
    "engine.llm_engine": ("LLMEngine",),
    "engine.async_engine": ("AsyncLLMEngine",),
    "engine.config": ("EngineConfig",),
    "engine.sampling_params": (
        "SamplingParams", "MAX_CHOICES", "MAX_TOP_LOGPROBS", "MAX_PENALTY", "MAX_LOGIT_BIAS", "MAX_LOGIT_BIAS_TOKENS",
    ),
    "engine.outputs": ("RequestOutput", "TokenLogprobs"),
    "engine.envelope": (
        "ExecutionEnvelope", "CacheScope", "Isolation", "isolation_key", "keyed_digest", "local_envelope",
        "tenant_digest", "PublicSegment", "segment_digest", "MAX_PUBLIC_SEGMENTS",
    ),
    "engine.tokenizer": ("Tokenizer",),
    "engine.ids": ("random_hex", "random_uuid"),
    "engine.telemetry": (
        "RecordSink", "ListSink", "PrometheusSink", "PendingRecords", "StepHistory", "RequestRecord", "StepRecord",
    ),
    "engine.encoder": ("AsyncEncoder", "Encoder"),
    "engine.model.catalog": (
        "DEFAULT_MODEL", "resolve_model_path", "served_model_name", "packaged_model_file",
        "resolve_encoder_path", "served_encoder_name", "PACKAGED_ENCODERS", "PackagedModel",
    ),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    *_LAZY,
    "ConfigError",
    "EncoderError",
    "EngineDeadError",
    "EnvelopeError",
    "GGUFError",
    "ModelNotFoundError",
    "RequestError",
    "SamplingParamsError",
    "TokenizerError",
    "WeightsError",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
