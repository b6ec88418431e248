"""Chat completions as they are sent: the chunks of a stream, or the whole chat.completion.

With tools, how the answer is read depends on who made the calls and on tool_choice:
- an upstream makes its own calls: they pass on as it sends them;
- a named function: the answer is its arguments, streamed as the call's from the first token;
- `auto`: content streams as it is generated, and each call once its tag closes (AutoCalls);
- `required`: the answer is read whole, then sent as its calls.
"""

from __future__ import annotations

from engine import RequestOutput
from gateway.deployments.base import UpstreamOutput
from gateway.openai.chat.protocol import ChatCompletionRequest
from gateway.openai.chat.tools import AutoCalls, NamedToolChoice, new_call_id, parse_calls
from gateway.openai.responder import (
    Renderer,
    chat_logprobs,
    finish_reason,
    joined_by_choice,
    json_bytes,
    system_fingerprint,
    usage,
)
from gateway.pipeline.run import Run


def chat_finish_reason(reason: str | None, *, called: bool) -> str | None:
    """OpenAI's finish_reason: tool_calls for an answer that stopped at the calls the model chose
    (a named function's call is the caller's choice: its answer stops)."""
    return "tool_calls" if called and reason == "stop" else finish_reason(reason)


def answer(body: ChatCompletionRequest, text: str, reason: str | None) -> tuple[dict, str | None]:
    """The assistant message for the engine's answer to `body`, and its finish_reason. /v1/responses
    reads its function calls from the same message."""
    tools = body.active_tools
    calls, content = parse_calls(text, tools, body.tool_choice, body.parallel_calls) if tools else (None, text)
    message = {"role": "assistant", "content": content, "refusal": None, "tool_calls": calls}
    named = isinstance(body.tool_choice, NamedToolChoice)
    return message, chat_finish_reason(reason, called=bool(calls) and not named)


class ChatRenderer(Renderer):
    def __init__(self, run: Run, body: ChatCompletionRequest, token_text=None) -> None:
        super().__init__(run)
        self.body = body
        self.token_text = token_text  # with logprobs: the model's text of each token id
        self.tools = body.active_tools
        self.extra = {"usage": None} if body.stream_options and body.stream_options.include_usage else {}
        # A named function's name (its answer is that call's arguments); None under any other choice.
        self.named = (body.tool_choice.function.name if self.tools and isinstance(body.tool_choice, NamedToolChoice)
                      else None)
        self.reader = AutoCalls(self.tools, body.parallel_calls) if body.reads_calls_as_generated else None
        self.call_id, self.opened = (new_call_id() if self.named is not None else ""), False  # a named function's call
        self.held: list[str] = []  # under `required`, the answer so far
        # Text only: no tools to read or pass on, no logprobs (delta() writes a content chunk, spliced here).
        self.plain = not self.tools and self.reader is None and token_text is None
        self._frames: dict[int, tuple[bytes, bytes]] = {}  # by choice: _content_frame's

    def base(self) -> dict:
        run = self.run
        return {"id": run.request_id, "object": "chat.completion.chunk", "created": run.admitted.created,
                "model": self.body.model, "system_fingerprint": system_fingerprint(run)}

    def chunk(self, delta: dict, reason: str | None = None, index: int = 0) -> dict:
        return self.base() | self.extra | {"choices": [{"index": index, "delta": delta, "logprobs": None,
                                                        "finish_reason": reason}]}

    def opening(self) -> list[dict]:
        return [self.base() | self.extra | {"choices": [
            {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for index in range(self.body.n)]}]

    def delta_events(self, output: RequestOutput) -> bytes:
        # A stream's most frequent event, a choice's new text, is spliced into its constant JSON.
        if output.new_text and not output.finished and self.plain:
            head, tail = self._content_frame(output.index)
            return head + json_bytes(output.new_text) + tail
        return super().delta_events(output)

    def _content_frame(self, index: int) -> tuple[bytes, bytes]:
        """The bytes around a content delta's text for choice `index`: encoded once per stream (the
        answering target, in its system_fingerprint, never changes after the first output)."""
        frame = self._frames.get(index)
        if frame is None:
            event = self.encode(self._content_chunk(index, ""))
            head, _, tail = event.rpartition(b'"content":""')
            frame = self._frames[index] = (head + b'"content":', tail)
        return frame

    def _content_chunk(self, index: int, text: str, logprobs: dict | None = None) -> dict:
        return self.base() | self.extra | {"choices": [
            {"index": index, "delta": {"content": text}, "finish_reason": None, "logprobs": logprobs}]}

    def delta(self, output: RequestOutput) -> list[dict]:
        if self.tools and isinstance(output, UpstreamOutput):
            return self._upstream_calls(output)
        if self.named is not None:
            return self._named_call(self.named, output)
        if self.reader is not None:
            return self._auto_calls(self.reader, output)
        if self.tools:
            return self._required_calls(output)
        out = []
        if output.new_text or output.logprobs:
            logprobs = ({"content": chat_logprobs(self.token_text, output.logprobs)}
                        if self.token_text is not None else None)
            out.append(self._content_chunk(output.index, output.new_text, logprobs))
        if output.finished:
            out.append(self.chunk({}, finish_reason(output.finish_reason), output.index))
        return out

    def _upstream_calls(self, output: UpstreamOutput) -> list[dict]:
        delta: dict[str, object] = {"content": output.new_text} if output.new_text else {}
        if output.tool_calls:
            delta["tool_calls"] = output.tool_calls
        out = [self.chunk(delta)] if delta else []
        if output.finished:
            out.append(self.chunk({}, finish_reason(output.finish_reason)))
        return out

    def _named_call(self, name: str, output: RequestOutput) -> list[dict]:
        out = []
        if not self.opened:
            self.opened = True
            function = {"name": name, "arguments": ""}
            out.append(self.chunk({"tool_calls": [{"index": 0, "id": self.call_id, "type": "function",
                                                   "function": function}]}))
        if output.new_text:
            out.append(self.chunk({"tool_calls": [{"index": 0, "function": {"arguments": output.new_text}}]}))
        if output.finished:
            out.append(self.chunk({}, finish_reason(output.finish_reason)))
        return out

    def _auto_calls(self, reader: AutoCalls, output: RequestOutput) -> list[dict]:
        out: list[dict] = []
        content, made = reader.feed(output.new_text)
        content += reader.finish() if output.finished else ""
        if content:
            out.append(self.chunk({"content": content}))
        if made:
            first = len(reader.calls) - len(made)
            out.append(self.chunk({"tool_calls": [call | {"index": first + i} for i, call in enumerate(made)]}))
        if output.finished:
            out.append(self.chunk({}, chat_finish_reason(output.finish_reason, called=bool(reader.calls))))
        return out

    def _required_calls(self, output: RequestOutput) -> list[dict]:
        self.held.append(output.new_text)
        if not output.finished:
            return []
        message, reason = answer(self.body, "".join(self.held), output.finish_reason)
        calls = message["tool_calls"]
        delta = ({"tool_calls": [call | {"index": i} for i, call in enumerate(calls)]} if calls
                 else {"content": message["content"]})
        return [self.chunk(delta), self.chunk({}, reason)]

    def closing(self) -> list[dict]:
        return [self.base() | {"choices": [], "usage": usage(self.run)}] if self.extra else []

    def whole(self, outputs: list[RequestOutput]) -> dict:
        # With tools there is one choice (ChatCompletionRequest), and an upstream calls them itself.
        upstream_called = bool(self.tools) and any(isinstance(o, UpstreamOutput) for o in outputs)
        choices = []
        for index, (text, token_logprobs) in enumerate(joined_by_choice(outputs, self.body.n)):
            reason = self.run.finish_reasons.get(index)
            if upstream_called:
                calls = [c for o in outputs if isinstance(o, UpstreamOutput) for c in o.tool_calls]
                message = {"role": "assistant", "content": text or None if calls else text, "refusal": None,
                           "tool_calls": calls}
                reason = finish_reason(reason)
            else:
                message, reason = answer(self.body, text, reason)
            if not message["tool_calls"]:
                del message["tool_calls"]
            choices.append({
                "index": index,
                "message": message,
                "logprobs": {"content": chat_logprobs(self.token_text, token_logprobs),
                             "refusal": None} if self.token_text is not None else None,
                "finish_reason": reason,
            })
        return self.base() | {"object": "chat.completion", "choices": choices, "usage": usage(self.run)}
