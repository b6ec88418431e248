"""Sentence embeddings: a BERT encoder with mean pooling, loaded from a sentence-transformers checkpoint."""

from engine.encoder.async_encoder import AsyncEncoder
from engine.encoder.encoder import Encoder
from engine.errors import EncoderError

__all__ = ["AsyncEncoder", "Encoder", "EncoderError"]
