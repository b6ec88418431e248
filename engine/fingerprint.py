"""A model fingerprint: one digest over everything that can change a logit.

Weights (the bytes of every weight file), the tokenizer, the parsed model config
(architecture, RoPE, norms, window...), the dtype, quantized kernels and their instruction set
where they serve the weights, and the engine's numerics version.
Two engines with the same fingerprint compute the same function of token ids; the
prefix cache must never reuse KV across different fingerprints.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

# Bump when a change to the engine's kernels could change results for the same weights.
NUMERICS_VERSION = "tenantgate-engine-numerics/1"

_CHUNK = 1 << 22


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class _Config(Protocol):
    """A model's configuration (engine.config.ModelConfig, or the encoder's BertConfig)."""

    def as_dict(self) -> dict[str, Any]: ...


def model_fingerprint(
    weight_files: list[Path], tokenizer_digest: str, model_config: _Config, dtype: str,
    weights: str = "dequantized", digests: Mapping[Path, str] | None = None,
) -> str:
    """`weights`: "dequantized", or the quantized kernels and their instruction set ("quantized-avx512"),
    whose sums run in another order than the dense path's. `digests`: file_digest of some of the
    files, taken earlier (LLMEngine hashes them while the quantized kernels build)."""
    known = digests or {}
    manifest = {
        "numerics": NUMERICS_VERSION,
        "weights": {f.name: known.get(f) or file_digest(f) for f in weight_files},
        "tokenizer": tokenizer_digest,
        "config": model_config.as_dict(),
        "dtype": dtype,
    }
    if weights != "dequantized":  # keeps the fingerprints of dense weights as they were
        # Beside the files' digests, never instead of them: two quantized checkpoints that differ
        # only in their weights must not share a fingerprint (and so a prefix cache).
        manifest["kernels"] = weights
    encoded = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()
