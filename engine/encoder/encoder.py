"""Sentence embeddings with a BERT encoder: tokenize, encode in batches, mean-pool, L2-normalise.

The same function as sentence-transformers' Transformer → Pooling(mean) → Normalize pipeline
(tests/engine/test_encoder.py holds it to that oracle). Each row's padding is masked out of
attention and of the mean, so an input's vector is the same, to float rounding, whatever else
shares its forward (AsyncEncoder puts shared-lane callers' inputs in one).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer

from engine.encoder.bert import BertConfig, BertEncoder
from engine.errors import EncoderError, WeightsError
from engine.fingerprint import file_digest, model_fingerprint
from engine.model.loader import weight_files
from engine.model_runner import resolve_device, resolve_dtype

logger = logging.getLogger(__name__)

# Checkpoint tensors mean pooling does not use: the position-id buffer and BERT's CLS pooler.
_UNUSED_PREFIXES = ("embeddings.position_ids", "pooler.")
DEFAULT_BATCH_SIZE = 32


def _max_seq_length(path: Path, config: BertConfig) -> int:
    """sentence-transformers' own limit (sentence_bert_config.json), capped by the position table."""
    try:
        declared = json.loads((path / "sentence_bert_config.json").read_text()).get("max_seq_length")
    except (OSError, ValueError):
        declared = None
    if not isinstance(declared, int) or declared < 2:
        declared = config.max_position_embeddings
    return min(declared, config.max_position_embeddings)


def _pooling_is_mean(path: Path) -> bool:
    pooling = path / "1_Pooling" / "config.json"
    if not pooling.is_file():
        return True  # a plain BERT checkpoint: mean pooling, sentence-transformers' default
    try:
        raw = json.loads(pooling.read_text())
    except (OSError, ValueError):
        return False
    modes = [key for key, value in raw.items() if key.startswith("pooling_mode_") and value]
    return modes == ["pooling_mode_mean_tokens"]


@torch.inference_mode()
def _load_weights(model: BertEncoder, files: list[Path]) -> None:
    targets = model.checkpoint_names()
    loaded = set()
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for raw_name in f.keys():
                    name = raw_name.removeprefix("bert.")
                    if name.startswith(_UNUSED_PREFIXES):
                        continue
                    if name not in targets:
                        raise EncoderError(f"unexpected tensor {raw_name!r} in {file.name}")
                    tensor, param = f.get_tensor(raw_name), targets[name]
                    if tensor.shape != param.shape or not tensor.is_floating_point():
                        raise EncoderError(f"tensor {raw_name!r} in {file.name} has shape {tuple(tensor.shape)} "
                                           f"and dtype {tensor.dtype}; the config implies {tuple(param.shape)}")
                    param.copy_(tensor)
                    loaded.add(name)
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise EncoderError(f"{file.name} is not a readable safetensors file: {exc}") from None
    missing = sorted(set(targets) - loaded)
    if missing:
        raise EncoderError(f"tensor {missing[0]!r} is missing from the checkpoint ({len(missing)} missing)")


class Encoder:
    """A sentence-embedding model on one device. Not thread-safe: one thread runs its forwards
    (AsyncEncoder's worker, in the gateway)."""

    def __init__(self, path: Path, *, device: str = "auto", dtype: str = "auto",
                 batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        path = Path(path)
        if batch_size < 1:
            raise EncoderError("batch_size must be at least 1")
        self.config = BertConfig.from_dir(path)
        if not _pooling_is_mean(path):
            raise EncoderError(f"{path}: only mean pooling is supported (1_Pooling/config.json)")
        try:
            files = weight_files(path)
        except WeightsError as exc:
            raise EncoderError(str(exc)) from None
        try:
            self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception subclass
            raise EncoderError(f"{path / 'tokenizer.json'} cannot be loaded: {exc}") from None
        self.max_seq_length = _max_seq_length(path, self.config)
        # tokenizer.json may carry its exporter's padding and truncation; ours are the model's limit.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_seq_length)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.batch_size = batch_size
        self.dimensions = self.config.hidden_size
        self.vocab_size = self.config.vocab_size
        model = BertEncoder(self.config)
        _load_weights(model, files)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.fingerprint = model_fingerprint(files, file_digest(path / "tokenizer.json"), self.config,
                                             str(self.dtype).removeprefix("torch."))
        logger.info("encoder ready: %d layers, %d dimensions, %d tokens per input, on %s in %s",
                    self.config.num_hidden_layers, self.dimensions, self.max_seq_length, self.device, self.dtype)

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids with [CLS] and [SEP], truncated at max_seq_length as sentence-transformers does."""
        return [encoding.ids for encoding in self.tokenizer.encode_batch(texts)]

    def check(self, inputs: list[list[int]]) -> None:
        """Raises EncoderError for an input embed() would refuse: empty, too long, or an id out of the vocabulary."""
        for ids in inputs:
            if not 0 < len(ids) <= self.max_seq_length:
                raise EncoderError(f"an input must have 1 to {self.max_seq_length} tokens")
            if not all(0 <= token < self.vocab_size for token in ids):
                raise EncoderError(f"token ids must be in [0, {self.vocab_size})")

    @torch.inference_mode()
    def embed(self, inputs: list[list[int]]) -> torch.Tensor:
        """Unit-length float32 vectors, one row per input, in the order given. Inputs are batched by
        length (less padding); padded positions are masked out of attention and of the mean."""
        self.check(inputs)
        out = torch.empty(len(inputs), self.dimensions, dtype=torch.float32)
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            width = max(len(inputs[i]) for i in rows)
            ids = torch.zeros(len(rows), width, dtype=torch.long)
            mask = torch.zeros(len(rows), width, dtype=torch.long)
            for row, index in enumerate(rows):
                ids[row, :len(inputs[index])] = torch.tensor(inputs[index])
                mask[row, :len(inputs[index])] = 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            hidden = self.model(ids, mask).float()
            weights = mask.unsqueeze(-1).float()
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            out[rows] = F.normalize(pooled, p=2, dim=1).cpu()
        return out
