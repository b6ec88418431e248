"""Envelope tokens: one test per way a token is refused, and what an accepted one yields."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engine.remote import (
    MAX_TTL_S,
    REJECTION_REASONS,
    EnvelopeRejected,
    EnvelopeSigner,
    EnvelopeVerifier,
    envelope_from_json,
    envelope_to_json,
    key_id,
    load_private_key,
    load_public_keys,
)
from engine.remote.signing import CLOCK_LEEWAY_S, ReplayCache, body_digest
from tests.utils.envelopes import envelope, segment
from tests.utils.signing import write_key_pair

NOW = 1_750_000_000.0
ENV = envelope(tenant="northwind", scope="principal", isolation="tenant", deterministic=True, quota=64, priority=2)


def body(request_id: str = "req-1", token_ids: tuple[int, ...] = (1, 2, 3)) -> bytes:
    return json.dumps({"request_id": request_id, "token_ids": list(token_ids), "params": {}}).encode()


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def signer(key) -> EnvelopeSigner:
    return EnvelopeSigner(key)


@pytest.fixture
def verifier(key) -> EnvelopeVerifier:
    return EnvelopeVerifier([Ed25519PrivateKey.generate().public_key(), key.public_key()])


def refused(verifier: EnvelopeVerifier, token: str, data: bytes, now: float = NOW) -> str:
    with pytest.raises(EnvelopeRejected) as caught:
        verifier.verify(token, data, now=now)
    assert caught.value.reason in REJECTION_REASONS
    return caught.value.reason


def claims_of(signer: EnvelopeSigner, **changes) -> dict:
    claims = {"kid": signer.kid, "iat": int(NOW), "exp": int(NOW) + 30, "request_id": "req-1",
              "body_sha256": body_digest(body()), "envelope": envelope_to_json(ENV)}
    return claims | changes


def test_a_signed_envelope_round_trips_with_its_request_id(signer, verifier) -> None:
    token = signer.sign(ENV, "req-1", body(), now=NOW)
    assert verifier.verify(token, body(), now=NOW + 29) == (ENV, "req-1")


def test_an_envelope_without_a_cache_namespace_round_trips(signer, verifier) -> None:
    private = envelope(scope="none")
    assert verifier.verify(signer.sign(private, "req-1", body(), now=NOW), body(), now=NOW)[0] == private


def test_an_envelope_with_public_segments_round_trips_signed(signer, verifier) -> None:
    segmented = envelope(segments=(segment(list(range(40))), segment(list(range(20)), owner="tenant:tenant-a")))
    assert len(segmented.public_segments) == 2
    assert verifier.verify(signer.sign(segmented, "req-1", body(), now=NOW), body(), now=NOW)[0] == segmented
    assert "public_segments" not in envelope_to_json(envelope())  # a replica from before them takes the rest


def test_a_speculative_envelope_round_trips_signed_and_one_from_before_it_does_not_speculate(signer,
                                                                                              verifier) -> None:
    speculative = envelope(speculative=True)
    assert envelope_to_json(speculative)["speculative"] is True
    assert verifier.verify(signer.sign(speculative, "req-1", body(), now=NOW), body(), now=NOW)[0] == speculative
    # A gateway from before the field sends none (and a replica from before it gets none when off).
    older = envelope_to_json(envelope())
    assert "speculative" not in older
    assert envelope_from_json(older) == envelope()
    assert not envelope_from_json(older).speculative
    with pytest.raises(ValueError, match="envelope.speculative must be a boolean"):
        envelope_from_json(older | {"speculative": "yes"})


def test_a_token_signed_by_another_key_with_a_trusted_kid_is_a_bad_signature(signer, verifier) -> None:
    forger = EnvelopeSigner(Ed25519PrivateKey.generate())
    assert refused(verifier, forger.encode(claims_of(signer)), body()) == "bad_signature"


def test_an_altered_claim_breaks_the_signature(signer, verifier) -> None:
    token = signer.sign(ENV, "req-1", body(), now=NOW)
    head, sig = token.split(".")
    claims = claims_of(signer) | {"envelope": envelope_to_json(envelope(isolation="shared"))}
    forged = signer.encode(claims).split(".")[0] + "." + sig
    assert refused(verifier, forged, body()) == "bad_signature"


def test_a_key_the_server_does_not_hold_is_unknown(verifier) -> None:
    stranger = EnvelopeSigner(Ed25519PrivateKey.generate())
    assert refused(verifier, stranger.sign(ENV, "req-1", body(), now=NOW), body()) == "unknown_key"


@pytest.mark.parametrize("token", ["", "abc", "a.b.c", "!!!.###", "e30.AAAA", "W10.AAAA", "x" * 5000,
                                   base64.urlsafe_b64encode(b"[" * 3000).decode() + ".AAAA"])
def test_garbage_is_malformed(verifier, token) -> None:
    assert refused(verifier, token, body()) == "malformed"


def test_a_claim_set_with_a_missing_or_extra_field_is_malformed(signer, verifier) -> None:
    claims = claims_of(signer)
    del claims["exp"]
    assert refused(verifier, signer.encode(claims), body()) == "malformed"
    assert refused(verifier, signer.encode(claims_of(signer, extra=1)), body()) == "malformed"


def test_signed_but_ill_typed_claims_are_malformed(signer, verifier) -> None:
    bad_envelope = envelope_to_json(ENV) | {"isolation": "nobody"}
    for changes in ({"iat": "now"}, {"exp": 1.5}, {"request_id": ""}, {"envelope": bad_envelope},
                    {"envelope": envelope_to_json(ENV) | {"cache_namespace": "zz"}}):
        assert refused(verifier, signer.encode(claims_of(signer, **changes)), body()) == "malformed", changes


def test_a_kid_that_is_not_a_string_is_unknown(signer, verifier) -> None:
    assert refused(verifier, signer.encode(claims_of(signer, kid=["list"])), body()) == "unknown_key"


def test_a_ttl_over_the_limit_is_refused_even_when_signed(signer, verifier) -> None:
    token = signer.encode(claims_of(signer, exp=int(NOW) + MAX_TTL_S + 1))
    assert refused(verifier, token, body()) == "ttl_too_long"
    with pytest.raises(ValueError, match="ttl"):
        EnvelopeSigner(Ed25519PrivateKey.generate(), ttl_s=MAX_TTL_S + 1)


def test_an_expired_token_is_refused_after_the_leeway(signer, verifier) -> None:
    token = signer.sign(ENV, "req-1", body(), now=NOW)
    assert refused(verifier, token, body(), now=NOW + 30 + CLOCK_LEEWAY_S + 1) == "expired"
    assert verifier.verify(token, body(), now=NOW + 30 + CLOCK_LEEWAY_S) == (ENV, "req-1")


def test_a_token_from_the_future_is_not_yet_valid(signer, verifier) -> None:
    token = signer.sign(ENV, "req-1", body(), now=NOW + CLOCK_LEEWAY_S + 2)
    assert refused(verifier, token, body(), now=NOW) == "not_yet_valid"


def test_a_token_bound_to_another_body_is_refused(signer, verifier) -> None:
    token = signer.sign(ENV, "req-1", body(token_ids=(1, 2, 3)), now=NOW)
    assert refused(verifier, token, body(token_ids=(1, 2, 4))) == "body_mismatch"


def test_a_body_naming_another_request_id_is_refused(signer, verifier) -> None:
    other = body(request_id="req-2")
    assert refused(verifier, signer.sign(ENV, "req-1", other, now=NOW), other) == "request_id_mismatch"
    assert refused(verifier, signer.sign(ENV, "req-1", b"not json", now=NOW), b"not json") == "request_id_mismatch"


def test_a_replayed_request_id_is_refused_until_its_token_expires(signer, verifier) -> None:
    token = signer.sign(ENV, "req-1", body(), now=NOW)
    verifier.verify(token, body(), now=NOW)
    assert refused(verifier, token, body(), now=NOW + 1) == "replayed"
    # A fresh token for the same id is a replay too: the id, not the token, is what is remembered.
    assert refused(verifier, signer.sign(ENV, "req-1", body(), now=NOW + 2), body(), now=NOW + 2) == "replayed"


def test_a_token_is_checked_without_its_body_and_then_against_it(signer, verifier) -> None:
    token = signer.sign(ENV, "req-1", body(), now=NOW)
    checked = verifier.verify_token(token, now=NOW)  # no body needed for form, key, signature, lifetime
    with pytest.raises(EnvelopeRejected, match="body_mismatch"):
        verifier.verify_body(checked, body(token_ids=(9,)), now=NOW)
    with pytest.raises(EnvelopeRejected, match="expired"):  # the body took too long to arrive
        verifier.verify_body(checked, body(), now=NOW + 30 + CLOCK_LEEWAY_S + 1)
    assert verifier.verify_body(checked, body(), now=NOW + 1) == (ENV, "req-1")
    # Once accepted, its id is refused before any body is read.
    with pytest.raises(EnvelopeRejected, match="replayed"):
        verifier.verify_token(signer.sign(ENV, "req-1", body(), now=NOW + 2), now=NOW + 2)


def test_a_refused_token_does_not_burn_its_request_id(signer, verifier) -> None:
    token = signer.sign(ENV, "req-1", body(), now=NOW)
    assert refused(verifier, token, body(token_ids=(9,))) == "body_mismatch"
    assert verifier.verify(token, body(), now=NOW) == (ENV, "req-1")


def test_the_replay_cache_forgets_expired_ids_and_refuses_when_full() -> None:
    cache = ReplayCache(max_entries=2)
    cache.add("a", NOW + 10, NOW)
    cache.add("b", NOW + 20, NOW)
    with pytest.raises(EnvelopeRejected) as caught:
        cache.add("c", NOW + 30, NOW + 5)
    assert caught.value.reason == "replay_cache_full"  # fails closed rather than forgetting "a" early
    cache.add("c", NOW + 30, NOW + 11)  # "a" expired and was pruned
    assert len(cache) == 2
    with pytest.raises(EnvelopeRejected, match="replayed"):
        cache.add("b", NOW + 40, NOW + 12)


def test_keys_load_from_a_file_or_a_directory_and_the_kid_is_the_public_key_digest(tmp_path) -> None:
    first = write_key_pair(tmp_path / "keys", tmp_path / "private", "first")
    second = write_key_pair(tmp_path / "keys", tmp_path / "private", "second")
    (tmp_path / "keys" / "..data").mkdir()  # a Kubernetes secret mount's own entries are skipped
    loaded = load_public_keys(tmp_path / "keys")
    assert sorted(key_id(k) for k in loaded) == sorted([first.kid, second.kid])
    assert [key_id(k) for k in load_public_keys(tmp_path / "keys" / "first.pub.pem")] == [first.kid]
    assert EnvelopeSigner(load_private_key(tmp_path / "private" / "first.pem")).kid == first.kid
    with pytest.raises(ValueError, match="not a PEM public key"):
        load_public_keys(tmp_path / "private")  # a private key is not accepted as a public one
    with pytest.raises(ValueError, match="at least one public key"):
        EnvelopeVerifier([])


def test_the_envelope_json_refuses_unknown_missing_and_ill_typed_fields() -> None:
    document = envelope_to_json(ENV)
    assert envelope_from_json(document) == ENV
    for bad in ({**document, "tenant": "x"}, {k: v for k, v in document.items() if k != "priority"},
                {**document, "kv_block_quota": True}, {**document, "isolation_key": "00"},
                {**document, "public_segments": {}}, {**document, "public_segments": [{"digest": "00"}]},
                {**document, "public_segments": [{"digest": "00" * 32, "num_tokens": "8", "namespace": "00" * 32}]},
                {**document, "public_segments": [{"digest": "00" * 32, "num_tokens": 0, "namespace": "00" * 32}]}):
        with pytest.raises(ValueError):
            envelope_from_json(bad)
