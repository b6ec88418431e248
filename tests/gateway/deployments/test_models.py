"""Several models at once: an embedded engine and an OpenAI-compatible upstream behind one gateway,
each listed (and reachable) only for the tenants whose policy names it."""

from __future__ import annotations

import json

import openai
import pytest

from devkit.server import free_port, serving
from engine import EngineConfig, LLMEngine
from gateway.app import create_app
from gateway.inference import EngineBackend
from tests.gateway.api.conftest import ALPHA, AUDIENCE, BETA, gateway_settings


@pytest.fixture(scope="module")
def gateway(local_issuer, demo_model_dir, tmp_path_factory):
    engine = LLMEngine(EngineConfig(model=str(demo_model_dir), kv_cache_memory_bytes=16 << 20, max_num_seqs=4,
                                    max_model_len=512))
    deployments = tmp_path_factory.mktemp("models") / "deployments.json"
    # Beta's policy names "some-other-model"; nothing listens at this upstream (listing asks nobody).
    deployments.write_text(json.dumps({"models": {
        "demo": [{"name": "local", "kind": "embedded"}],
        "some-other-model": [{"name": "vllm-a", "kind": "openai", "dialect": "vllm",
                              "url": f"http://127.0.0.1:{free_port()}/v1", "connect_timeout_s": 0.5}]}}))
    settings = gateway_settings(local_issuer, deployments_file=deployments, metrics_port=0)
    app = create_app(settings, backend=EngineBackend(engine, model_name="demo"))
    with serving(app) as base_url:
        yield base_url
    app.state.gateway.backend.async_engine.shutdown()


def client(base_url: str, issuer, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key=issuer.mint(tenant, audience=AUDIENCE), max_retries=0)


def test_each_tenant_lists_the_models_its_policy_allows(gateway, local_issuer) -> None:
    with client(gateway, local_issuer, ALPHA) as alpha, client(gateway, local_issuer, BETA) as beta:
        assert [m.id for m in alpha.models.list()] == ["demo"]
        assert [m.id for m in beta.models.list()] == ["some-other-model"]
        with pytest.raises(openai.NotFoundError):
            alpha.models.retrieve("some-other-model")
        reply = alpha.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert reply.usage.completion_tokens == 2


def test_an_unreachable_upstream_is_a_503_in_openai_shape(gateway, local_issuer) -> None:
    with client(gateway, local_issuer, BETA) as beta, pytest.raises(openai.InternalServerError) as failed:
        beta.chat.completions.create(model="some-other-model", messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=2)
    assert failed.value.status_code == 503 and failed.value.body["type"] == "service_unavailable"
