"""Sentence embeddings: a BERT encoder with mean pooling, loaded from a sentence-transformers checkpoint."""

from engine.encoder.bert import EncoderError
from engine.encoder.encoder import Encoder

__all__ = ["Encoder", "EncoderError"]
