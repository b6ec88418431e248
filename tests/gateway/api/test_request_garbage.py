"""A finished request leaves no reference cycle behind: its objects (the Request, the server's
request cycle, the middleware's wrappers, the pipeline's exchange) go when it ends, not at the
cyclic collector's next pass. With a cycle per request, those passes cost more than a tenth of a
decision-cache hit's CPU at concurrency 32, and paused the event loop between requests (issue 31).
Served over a real socket, called with the openai SDK, streamed and not."""

from __future__ import annotations

import gc
from collections import Counter

import openai

from devkit.server import serving
from gateway.app import create_app
from gateway.inference import NullBackend
from tests.gateway.api.conftest import ALPHA, AUDIENCE, gateway_settings

CHAT = [{"role": "user", "content": "hi"}]
OURS = ("gateway", "engine", "starlette", "fastapi", "uvicorn")


def calls(sdk: openai.OpenAI, n: int) -> None:
    for i in range(n):
        if i % 2:
            assert [chunk for chunk in sdk.chat.completions.create(model="demo", messages=CHAT, max_tokens=3,
                                                                    stream=True)]
        else:
            assert sdk.chat.completions.create(model="demo", messages=CHAT, max_tokens=3).choices


def test_requests_leave_no_cyclic_garbage(local_issuer) -> None:
    app = create_app(gateway_settings(local_issuer, metrics_port=0), backend=NullBackend(model_name="demo"))
    with serving(app) as base_url:
        with openai.OpenAI(base_url=base_url + "/v1", api_key=local_issuer.mint(ALPHA, audience=AUDIENCE),
                           max_retries=0) as sdk:
            calls(sdk, 4)  # what the first requests build once (caches, lazy imports) is not theirs
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept in gc.garbage, not freed
            try:
                calls(sdk, 20)
                gc.collect()
                found = Counter(type(o).__qualname__ for o in gc.garbage
                                if type(o).__module__.partition(".")[0] in OURS)
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
    assert not found, f"objects of the requests were left in reference cycles: {found.most_common(10)}"
