"""A BERT encoder (embeddings, post-norm layers, no pooler) in plain torch, for sentence embeddings."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import EncoderError


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_dir(cls, path: Path) -> BertConfig:
        try:
            raw = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise EncoderError(f"{path / 'config.json'} cannot be read as JSON: {exc}") from None
        if raw.get("model_type") != "bert":
            raise EncoderError(f"model_type {raw.get('model_type')!r} is not supported (only bert)")
        if raw.get("hidden_act", "gelu") != "gelu" or raw.get("position_embedding_type", "absolute") != "absolute":
            raise EncoderError("only BERT with gelu activations and absolute positions is supported")
        try:
            config = cls(**{name: raw[name] for name in cls.__dataclass_fields__})
        except KeyError as exc:
            raise EncoderError(f"config.json lacks {exc.args[0]!r}") from None
        if config.hidden_size % config.num_attention_heads:
            raise EncoderError("hidden_size must be a multiple of num_attention_heads")
        return config

    def as_dict(self) -> dict:
        return {"architecture": "bert-encoder", **asdict(self)}


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.layer_norm_eps
        self.num_heads = config.num_attention_heads
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attention_out = nn.Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=eps)
        self.intermediate = nn.Linear(h, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, h)
        self.output_norm = nn.LayerNorm(h, eps=eps)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.num_heads, hidden // self.num_heads).transpose(1, 2)

        # keep: (batch, 1, 1, length) True where a key is a real token, so padding is never attended to.
        attended = F.scaled_dot_product_attention(heads(self.query(x)), heads(self.key(x)), heads(self.value(x)),
                                                  attn_mask=keep)
        attended = attended.transpose(1, 2).reshape(batch, length, hidden)
        x = self.attention_norm(x + self.attention_out(attended))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class BertEncoder(nn.Module):
    """Token ids to the last layer's hidden states; checkpoint names map onto ours in checkpoint_names()."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, h)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, h)
        self.embedding_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # One segment: every token has type 0, as a single sentence does.
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings.weight[0]
        x = self.embedding_norm(x)
        keep = attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            x = layer(x, keep)
        return x

    def checkpoint_names(self) -> dict[str, torch.Tensor]:
        """Our parameters by their Hugging Face BertModel names (with or without a `bert.` prefix)."""
        names = {
            "embeddings.word_embeddings.weight": self.word_embeddings.weight,
            "embeddings.position_embeddings.weight": self.position_embeddings.weight,
            "embeddings.token_type_embeddings.weight": self.token_type_embeddings.weight,
            "embeddings.LayerNorm.weight": self.embedding_norm.weight,
            "embeddings.LayerNorm.bias": self.embedding_norm.bias,
        }
        parts = {"attention.self.query": "query", "attention.self.key": "key", "attention.self.value": "value",
                 "attention.output.dense": "attention_out", "attention.output.LayerNorm": "attention_norm",
                 "intermediate.dense": "intermediate", "output.dense": "output", "output.LayerNorm": "output_norm"}
        for index, layer in enumerate(self.layers):
            for theirs, ours in parts.items():
                module = getattr(layer, ours)
                names[f"encoder.layer.{index}.{theirs}.weight"] = module.weight
                names[f"encoder.layer.{index}.{theirs}.bias"] = module.bias
        return names
