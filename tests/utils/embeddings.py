"""Texts for embedding tests and the oracle: sentence-transformers on the same checkpoint, in float32."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

COSINE_MIN = 0.9999

_LONG = " ".join(f"The gateway judged request number {i} and wrote its audit record." for i in range(80))
TEXTS = [
    "What does a gateway do?",
    "A zero-trust gateway authenticates every request before it reaches the model.",
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France.",
    "How do I reverse a list in Python?",
    "def f(x):\n    return x ** 2",
    "SELECT * FROM tenants WHERE enabled = true;",
    "{\"key\": [1, 2.5e-3, null], \"nested\": {\"a\": \"b\"}}",
    "<div class=\"x\">&amp; &lt;tag&gt;</div>",
    "$ ls -la | grep '^d' && echo done",
    "1234567890 3.14159 0x1F 1,000,000",
    "UPPER CASE AND lower case AND MiXeD CaSe",
    "naïve café Straße façade coöperate",
    "e\u0301 (a combining accent) and \u00e9 (a precomposed one)",
    "日本語のテキストも埋め込めます。",
    "中文句子嵌入测试。",
    "한국어 문장입니다.",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "שלום עולם",
    "Ελληνικά γράμματα αβγδ",
    "हिन्दी में एक वाक्य",
    "emoji 😀 👍🏽 👨‍👩‍👧 🏳️‍🌈 in a sentence",
    "zero\u200bwidth\ufeffcharacters\ufffd",
    "ﬁ ligature, Ⅻ numeral, ² superscript",
    "[CLS] [SEP] [PAD] [MASK] [UNK] spelled as text",
    "<|endoftext|> <|im_start|>user",
    "!!!???...,,,;;;:::",
    "a",
    "I",
    "ok",
    "hello hello hello hello hello hello hello hello",
    "Tenants share a GPU fleet; policy decides what they may share.",
    "Memory is a security surface.",
    "The prefix cache is partitioned by a keyed namespace digest.",
    "Rego policies decide cache scope, batch isolation and logging.",
    "Embeddings map text to vectors whose cosine similarity tracks meaning.",
    "Il pleut des cordes aujourd'hui.",
    "Der Himmel ist heute sehr blau.",
    "El perro corre por el parque.",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "tab\tseparated\tvalues\there",
    "line one\nline two\r\nline three",
    _LONG,  # about 1,000 tokens: truncated at the model's 256
    "word " * 600,  # 600 words: truncated at 256 tokens
    "",
    " ",
    "\n\t  \r\n",
    "\u00a0\u3000",
    ".",
]


@functools.cache
def _oracle_model(model_dir: str):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the checkpoint is local; never ask the Hub
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_dir, device="cpu")


def oracle_embeddings(model_dir: Path, texts: list[str]) -> torch.Tensor:
    """sentence-transformers' unit vectors for `texts`, float32, on CPU."""
    model = _oracle_model(str(model_dir))
    return model.encode(texts, convert_to_tensor=True, batch_size=16).float().cpu()


def oracle_token_count(model_dir: Path, text: str) -> int:
    """How many tokens sentence-transformers feeds the model for `text` (after its truncation)."""
    return int(_oracle_model(str(model_dir)).preprocess([text])["attention_mask"].sum())


def cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=1)
