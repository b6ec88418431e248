"""Tool calls under `auto` as an agent sees them (issue 25, item 7), through the openai SDK over
loopback HTTP, with an engine that writes a fixed script: the content arrives while the answer is
still being generated (the engine waits, mid-answer, until the client has it), then each call as a
tool_calls delta with its own index, and finish_reason tool_calls; parallel_tool_calls false keeps
one call; the whole answer says the same. The script, not a model, decides the answer, so the
test is of the protocol alone."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import openai
import pytest

from devkit.server import serving
from engine import RequestOutput
from gateway.app import create_app
from gateway.inference import NullBackend
from tests.gateway.api.conftest import ALPHA, AUDIENCE, gateway_settings

CONTENT = ["Let", " me", " check", ".\n"]
CALLS = ['<tool_call>{"name": "get_weather", ', '"arguments": {"city": "Paris"}}</tool_call>\n',
         '<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>']
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {
    "type": "object", "properties": {key: {"type": "string"}}, "required": [key]}}}
    for name, key in (("get_weather", "city"), ("get_time", "zone"))]
QUESTION = [{"role": "user", "content": "Weather and time in Paris?"}]


class ScriptedBackend(NullBackend):
    """Writes CONTENT, then (when `pause` is set up) waits for the test to say it has read the
    content, then writes CALLS; each piece is one token."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.pause: threading.Event | None = None

    async def generate(self, token_ids, params, envelope, request_id):
        pieces = CONTENT + CALLS
        for n, piece in enumerate(pieces, start=1):
            if n == len(CONTENT) + 1 and self.pause is not None:
                seen = await asyncio.get_running_loop().run_in_executor(None, self.pause.wait, 30)
                assert seen, "the client never saw the content before the calls were generated"
            last = n == len(pieces)
            yield RequestOutput(request_id=request_id, new_token_ids=[7], new_text=piece,
                                num_prompt_tokens=len(token_ids), num_output_tokens=n,
                                finished=last, finish_reason="stop" if last else None)


@pytest.fixture(scope="module")
def scripted(local_issuer) -> Iterator[tuple[openai.OpenAI, ScriptedBackend]]:
    backend = ScriptedBackend(model_name="demo")
    app = create_app(gateway_settings(local_issuer, metrics_port=0), backend=backend)
    with serving(app) as base, openai.OpenAI(base_url=base + "/v1", api_key=local_issuer.mint(ALPHA, audience=AUDIENCE),
                                             max_retries=0, timeout=60) as client:
        yield client, backend


def test_content_streams_before_the_calls_and_each_call_has_its_own_index(scripted) -> None:
    client, backend = scripted
    backend.pause = threading.Event()
    try:
        stream = client.chat.completions.create(model="demo", messages=QUESTION, tools=TOOLS, stream=True)
        content, calls, reasons = "", [], []
        for chunk in stream:
            for choice in chunk.choices:
                content += choice.delta.content or ""
                calls.extend(choice.delta.tool_calls or [])
                reasons.append(choice.finish_reason)
            # all of it, while the engine still waits to write the calls
            if content == "Let me check." and not backend.pause.is_set():
                assert not calls
                backend.pause.set()
    finally:
        backend.pause.set()
        backend.pause = None
    assert content == "Let me check."
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (0, "get_weather", {"city": "Paris"}), (1, "get_time", {"zone": "CET"})]
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    assert reasons[-1] == "tool_calls"


def test_parallel_tool_calls_false_makes_one_call(scripted) -> None:
    client, _ = scripted
    calls = []
    for chunk in client.chat.completions.create(model="demo", messages=QUESTION, tools=TOOLS, stream=True,
                                                parallel_tool_calls=False):
        for choice in chunk.choices:
            calls.extend(choice.delta.tool_calls or [])
    assert [(c.index, c.function.name) for c in calls] == [(0, "get_weather")]
    message = client.chat.completions.create(model="demo", messages=QUESTION, tools=TOOLS,
                                             parallel_tool_calls=False).choices[0].message
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]


def test_the_whole_answer_carries_the_content_and_both_calls(scripted) -> None:
    client, _ = scripted
    choice = client.chat.completions.create(model="demo", messages=QUESTION, tools=TOOLS).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather", "get_time"]
