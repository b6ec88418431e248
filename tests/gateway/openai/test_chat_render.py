"""ChatRenderer: a content delta spliced into its stream's constant JSON is, byte for byte, the chunk
that encoding delta()'s dict writes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine import RequestOutput
from gateway.deployments.base import UpstreamOutput
from gateway.openai.chat.protocol import ChatCompletionRequest
from gateway.openai.chat.render import ChatRenderer

TEXTS = ["Hello", " world", "", '"quoted" \\ back\\slash', "line\nbreak\ttab\r\x00\x1f\x7f", "é 漢字 🙂",
         "\u2028\u2029", "</script>", "{\"content\":\"\"}"]


def renderer(**body) -> ChatRenderer:
    request = ChatCompletionRequest.model_validate(
        {"model": 'demo "model"', "messages": [{"role": "user", "content": "hi"}], "stream": True, **body})
    target = SimpleNamespace(fingerprint="upstream-0123456789abcdef")
    run = SimpleNamespace(request_id="chatcmpl-1", admitted=SimpleNamespace(created=1764806400, targets=[target]),
                          deployment=target)
    return ChatRenderer(run, request)  # type: ignore[arg-type]


@pytest.mark.parametrize("body", [{}, {"stream_options": {"include_usage": True}}, {"n": 3}])
@pytest.mark.parametrize("kind", [RequestOutput, UpstreamOutput])
def test_a_spliced_content_delta_is_the_encoded_chunk(body: dict, kind: type[RequestOutput]) -> None:
    render = renderer(**body)
    for index in range(render.body.n):
        for text in TEXTS:
            output = kind("chatcmpl-1", [], text, 0, 1, index=index)
            assert render.delta_events(output) == b"".join(map(render.encode, render.delta(output)))
    assert render.plain and len(render._frames) == render.body.n  # the spliced path ran, once per choice


def test_a_content_delta_is_sent_as_before() -> None:
    output = UpstreamOutput("chatcmpl-1", [], "Hi \"you\"", 0, 1)
    assert renderer().delta_events(output) == (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764806400,"model":"demo \\"model\\"",'
        b'"system_fingerprint":"fp_upstream-012","choices":[{"index":0,"delta":{"content":"Hi \\"you\\""},'
        b'"finish_reason":null,"logprobs":null}]}\n\n')


def test_a_last_delta_and_a_delta_with_tools_are_encoded_from_their_dicts() -> None:
    render = renderer()
    last = RequestOutput("chatcmpl-1", [], "end", 0, 2, finished=True, finish_reason="stop")
    assert render.delta_events(last) == b"".join(map(render.encode, render.delta(last)))
    tools = renderer(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    assert not tools.plain
