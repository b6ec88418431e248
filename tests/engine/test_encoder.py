"""The embedding encoder (engine/encoder) against sentence-transformers on the same checkpoint, and
its asyncio front (AsyncEncoder): what shares a step, and what a vector then depends on."""

import asyncio
import threading
from pathlib import Path

import pytest
import torch

from engine.encoder import AsyncEncoder, Encoder, EncoderError
from tests.utils.embeddings import COSINE_MIN, TEXTS, cosines, oracle_embeddings, oracle_token_count
from tests.utils.envelopes import envelope


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


async def test_shared_requests_of_two_tenants_share_a_step_and_get_their_vectors_alone(
    encoder: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = encoder.tokenize(TEXTS)
    short, long = ids[:5], [ids[-7]] * 2  # short inputs padded to 256 beside the long ones
    # Tenant c's step is held until a's and b's requests have queued, whatever this machine's
    # speed (a sleep raced it: a step that ended first let a run alone, CI saw 3 steps).
    started, release = threading.Event(), threading.Event()
    embed = encoder.embed

    def held(inputs: list[list[int]]) -> torch.Tensor:
        started.set()
        assert release.wait(30)
        return embed(inputs)

    monkeypatch.setattr(encoder, "embed", held)
    front = AsyncEncoder(encoder)
    try:
        busy = asyncio.ensure_future(front.embed([ids[-7]] * encoder.batch_size,
                                                 envelope("tenant-c", isolation="tenant")))
        assert await asyncio.to_thread(started.wait, 30)
        both = asyncio.gather(front.embed(short, envelope("tenant-a")), front.embed(long, envelope("tenant-b")))
        await asyncio.sleep(0)  # both requests reach the scheduler before c's step ends
        release.set()
        a, b = await both
        await busy
        assert front.steps == 2  # c's, then one for a's and b's inputs together
    finally:
        front.shutdown()
    monkeypatch.undo()
    for together, alone in ((a, encoder.embed(short)), (b, encoder.embed(long))):
        assert cosines(together, alone).min() >= 1 - 1e-6
        assert (together - alone).abs().max() < 1e-5


async def test_a_deterministic_request_gets_the_same_bits_beside_other_tenants_load(encoder: Encoder) -> None:
    ids = encoder.tokenize(TEXTS)
    mine = envelope("tenant-d", deterministic=True)
    front = AsyncEncoder(encoder)
    try:
        alone = await front.embed(ids[:12], mine)
        load = [front.embed(ids[12:30], envelope(f"tenant-{n}")) for n in range(3)]
        beside, *_ = await asyncio.gather(front.embed(ids[:12], mine), *load)
    finally:
        front.shutdown()
    assert torch.equal(alone, beside)


async def test_a_cancelled_request_runs_no_further_steps(encoder: Encoder) -> None:
    front = AsyncEncoder(encoder)
    long = encoder.tokenize([TEXTS[-7]])[0]
    try:
        task = asyncio.ensure_future(front.embed([long] * (20 * encoder.batch_size), envelope("tenant-a")))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await front.embed([long], envelope("tenant-b"))
        assert front.steps <= 3  # the step running when it was cancelled (and one more at most), then b's
    finally:
        front.shutdown()


async def test_inputs_out_of_bounds_are_refused_before_they_queue(encoder: Encoder) -> None:
    front = AsyncEncoder(encoder)
    with pytest.raises(EncoderError, match="token ids"):
        await front.embed([[101, 102], [101, encoder.vocab_size]], envelope("tenant-a"))
    assert front.steps == 0 and not front.scheduler.has_work()
