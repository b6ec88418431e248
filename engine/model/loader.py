"""Load Hugging Face safetensors checkpoints (single file or sharded) into our decoder."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from engine.errors import WeightsError
from engine.model.llama import Embedding, Linear, LlamaForCausalLM
from engine.model.quant import QUANTIZED_FILE, PackedWeight, QuantizedEmbedding, QuantizedLinear, format_from_str

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


def _iter_tensors(files: list[Path], skip: frozenset[str] = frozenset()) -> Iterator[tuple[str, Path, torch.Tensor]]:
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name in skip:  # never read: a packed copy serves it
                        continue
                    try:
                        tensor = f.get_tensor(name)
                    except (SafetensorError, RuntimeError, ValueError) as exc:
                        raise WeightsError(f"tensor {name!r} in {file.name} cannot be read: {exc}") from None
                    yield name, file, tensor
        except (SafetensorError, OSError) as exc:
            raise WeightsError(f"{file.name} is not a readable safetensors file: {exc}") from None


@torch.inference_mode()
def load_weights(model: LlamaForCausalLM, path: Path, progress: bool = False, isa: int | None = None,
                 threads: int = 1) -> None:
    """Fill the model from the checkpoint at path. With isa (the quantized kernels' instruction set),
    the layers whose weights the checkpoint also holds packed (quantized.safetensors) are replaced by
    quantized ones first, and their dense copies are never read; the model's small ops then run
    through the same kernels too (LlamaForCausalLM.use_cpu_kernels)."""
    files = weight_files(path)
    targets = model.checkpoint_tensors()
    packed = (frozenset(quantize_layers(model, path / QUANTIZED_FILE, targets, isa, threads)) if isa is not None
              else frozenset())
    loaded: set[str] = set(packed)
    bar = tqdm(total=len(targets), desc="loading weights", unit="tensor", disable=not progress, leave=False)
    with bar:
        for name, file, tensor in _iter_tensors(files, packed):
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
    if isa is not None:
        model.use_cpu_kernels()


def quantize_layers(model: LlamaForCausalLM, file: Path,
                    targets: dict[str, tuple[torch.Tensor, int, int]], isa: int, threads: int = 1) -> set[str]:
    """Swap each linear layer (and the embedding) whose whole weight `file` holds packed for its
    quantized twin; returns the checkpoint names it serves. A fused weight that is only partly
    packed (a dense k beside a packed q) stays dense."""
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            formats = json.loads(metadata.get("formats", "{}"))
            fused = json.loads(metadata.get("fused", "{}"))

            def packed(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
                return f.get_tensor(f"{name}.codes"), f.get_tensor(f"{name}.scales"), f.get_tensor(f"{name}.mins")

            weights = {}
            for group, members in fused.items():
                # One tensor of its members' rows in order: each member a view of its rows, so that
                # PackedWeight.cat joins them back without a copy.
                tensors, start = packed(group), 0
                for name in members:
                    fmt, cols, _ = format_from_str(formats[name])
                    rows = targets[name][2] if name in targets else 0
                    codes, scales, mins = (t[start:start + rows] for t in tensors)
                    weights[name] = PackedWeight(codes, scales, mins, cols, fmt)
                    start += rows
                if start != tensors[0].shape[0]:
                    raise ValueError(f"{group} has {tensors[0].shape[0]} rows, its members {start}")
            for name, text in formats.items():
                if name not in weights:
                    fmt, cols, _ = format_from_str(text)
                    weights[name] = PackedWeight(*packed(name), cols, fmt)
    except (SafetensorError, OSError, ValueError, KeyError) as exc:
        raise WeightsError(f"{file.name} is not a readable packed-weights file: {exc}") from None
    by_param: dict[int, list[tuple[int, str]]] = {}
    params: dict[int, torch.Tensor] = {}
    for name, weight in weights.items():
        if name not in targets:
            raise WeightsError(f"unexpected tensor {name!r} in {file.name}: the config does not describe it")
        param, start, rows = targets[name]
        if weight.rows != rows or weight.cols != param.shape[1]:
            raise WeightsError(f"tensor {name!r} in {file.name} is {weight.rows}x{weight.cols}, "
                               f"the config implies {rows}x{param.shape[1]}")
        by_param.setdefault(id(param), []).append((start, name))
        params[id(param)] = param
    owners: dict[int, list[tuple[torch.nn.Module, str, torch.nn.Module]]] = {}
    for parent in model.modules():
        for attr, child in parent.named_children():
            if isinstance(child, (Linear, Embedding)):
                owners.setdefault(id(child.weight), []).append((parent, attr, child))
    served: set[str] = set()
    for key, parts in by_param.items():
        parts.sort()
        covered = sum(weights[name].rows for _, name in parts)
        if covered != params[key].shape[0] or key not in owners:
            continue
        ordered = [weights[name] for _, name in parts]
        for parent, attr, child in owners[key]:
            layer: torch.nn.Module
            if isinstance(child, Embedding):
                layer = QuantizedEmbedding(PackedWeight.cat(ordered) if len(ordered) > 1 else ordered[0],
                                           params[key].dtype, isa)
            else:
                layer = QuantizedLinear(ordered, cast("torch.nn.Parameter | None", child.bias), isa, threads)
            setattr(parent, attr, layer)
        served.update(name for _, name in parts)
    return served
