"""A server that stops right after answering still settles that request's token budget: the
settlement is a task of its own, and shutdown waits for it before the quota store closes."""

from __future__ import annotations

import asyncio

import openai

from devkit.server import serving
from gateway.app import create_app
from gateway.inference import NullBackend
from gateway.limits import InProcessLimiter
from tests.gateway.api.conftest import ALPHA, AUDIENCE, gateway_settings


class SlowSettling(InProcessLimiter):
    """Settles half a second late, as a quota store under load may; remembers what it settled."""

    def __init__(self) -> None:
        super().__init__()
        self.settled: list[int] = []

    def settle_at_once(self, ticket, used_tokens: int) -> bool:
        return False  # as a store's limiter: settling is a call to make

    async def settle(self, ticket, used_tokens: int) -> None:
        await asyncio.sleep(0.5)
        super().settle_at_once(ticket, used_tokens)
        self.settled.append(used_tokens)


def test_a_settlement_still_running_at_shutdown_finishes(local_issuer) -> None:
    limiter = SlowSettling()
    app = create_app(gateway_settings(local_issuer, metrics_port=0), backend=NullBackend(model_name="demo"),
                     limiter=limiter)
    with serving(app) as base_url:
        with openai.OpenAI(base_url=base_url + "/v1", api_key=local_issuer.mint(ALPHA, audience=AUDIENCE),
                           max_retries=0) as sdk:
            reply = sdk.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=3)
        assert limiter.settled == []  # still sleeping when the server is told to stop
    assert limiter.settled == [reply.usage.total_tokens]
