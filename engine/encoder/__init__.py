"""Sentence embeddings: a BERT encoder with mean pooling, loaded from a sentence-transformers checkpoint."""

from engine.encoder.encoder import Encoder
from engine.errors import EncoderError

__all__ = ["Encoder", "EncoderError"]
