"""Load Hugging Face safetensors checkpoints (single file or sharded) into our decoder."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from engine.errors import WeightsError
from engine.model.llama import LlamaForCausalLM

# Buffers some exporters write that carry nothing we need (we derive RoPE from the config).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def weight_files(path: Path) -> list[Path]:
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise WeightsError(f"{index} is not a valid safetensors index (needs a 'weight_map' object)") from None
        files = [path / shard for shard in shards]
        for file in files:
            if file.parent != path or not file.is_file():
                raise WeightsError(f"shard {file.name!r} named in {index.name} is missing")
        return files
    raise WeightsError(f"no model.safetensors or model.safetensors.index.json in {path}")


def _iter_tensors(files: list[Path]) -> Iterator[tuple[str, Path, torch.Tensor]]:
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    try:
                        tensor = f.get_tensor(name)
                    except (SafetensorError, RuntimeError, ValueError) as exc:
                        raise WeightsError(f"tensor {name!r} in {file.name} cannot be read: {exc}") from None
                    yield name, file, tensor
        except (SafetensorError, OSError) as exc:
            raise WeightsError(f"{file.name} is not a readable safetensors file: {exc}") from None


@torch.inference_mode()
def load_weights(model: LlamaForCausalLM, path: Path, progress: bool = False) -> None:
    files = weight_files(path)
    targets = model.checkpoint_tensors()
    loaded: set[str] = set()
    bar = tqdm(total=len(targets), desc="loading weights", unit="tensor", disable=not progress, leave=False)
    with bar:
        for name, file, tensor in _iter_tensors(files):
            if name.endswith(_IGNORED_SUFFIXES) or (name == "lm_head.weight" and model.config.tie_word_embeddings):
                continue
            if name not in targets:
                raise WeightsError(f"unexpected tensor {name!r} in {file.name}: the config does not describe it")
            param, start, rows = targets[name]
            expected = (rows, *param.shape[1:])
            if tuple(tensor.shape) != expected:
                raise WeightsError(
                    f"tensor {name!r} in {file.name} has shape {tuple(tensor.shape)}, the config implies {expected}"
                )
            if not tensor.is_floating_point():
                raise WeightsError(f"tensor {name!r} in {file.name} has non-float dtype {tensor.dtype}")
            param[start : start + rows].copy_(tensor)
            loaded.add(name)
            bar.update()
    missing = sorted(set(targets) - loaded)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(f"tensor {missing[0]!r} is missing from the checkpoint{more}")
