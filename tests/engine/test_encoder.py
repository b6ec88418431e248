"""The embedding encoder (engine/encoder) against sentence-transformers on the same checkpoint."""

from pathlib import Path

import pytest
import torch

from engine.encoder import Encoder, EncoderError
from tests.utils.embeddings import COSINE_MIN, TEXTS, cosines, oracle_embeddings, oracle_token_count


@pytest.fixture(scope="module")
def encoder(encoder_dir: Path) -> Encoder:
    return Encoder(encoder_dir, device="cpu", dtype="float32", batch_size=8)


def test_embeddings_match_sentence_transformers(encoder: Encoder, encoder_dir: Path) -> None:
    ours = encoder.embed(encoder.tokenize(TEXTS))
    theirs = oracle_embeddings(encoder_dir, TEXTS)
    similarity = cosines(ours, theirs)
    worst = int(similarity.argmin())
    assert similarity.min() >= COSINE_MIN, f"text {worst} ({TEXTS[worst][:40]!r}): cosine {similarity[worst]:.6f}"
    assert torch.allclose(ours.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5)


def test_long_texts_are_truncated_as_sentence_transformers_does(encoder: Encoder, encoder_dir: Path) -> None:
    long_texts = [t for t in TEXTS if len(t) > 2000]
    assert long_texts
    for text, ids in zip(long_texts, encoder.tokenize(long_texts)):
        assert len(ids) == encoder.max_seq_length == 256 == oracle_token_count(encoder_dir, text)
        assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP], as the oracle keeps them


def test_an_input_vector_does_not_depend_on_its_batch(encoder: Encoder) -> None:
    ids = encoder.tokenize(TEXTS)
    alone = torch.cat([encoder.embed([one]) for one in ids[:6]])
    together = encoder.embed(ids)[:6]
    assert cosines(alone, together).min() >= 1 - 1e-6


def test_inputs_out_of_bounds_are_refused(encoder: Encoder) -> None:
    with pytest.raises(EncoderError):
        encoder.embed([[]])
    with pytest.raises(EncoderError):
        encoder.embed([[101] * (encoder.max_seq_length + 1)])
    with pytest.raises(EncoderError, match="token ids"):
        encoder.embed([[101, encoder.vocab_size]])


def test_a_checkpoint_that_is_not_bert_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(EncoderError, match="only bert"):
        Encoder(tmp_path, device="cpu")
