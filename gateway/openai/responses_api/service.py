"""Responses: translate the request into chat's, run it exactly as chat runs (policy, budget,
engine, audit), and answer with a response object or the Responses API's stream of events.
Where the policy allows it, a response is stored (encrypted, per tenant) and may be continued: by
its tenant, or where the decision's cache scope is principal (or none), by its principal alone."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from engine import RequestOutput
from gateway.auth.principal import Principal
from gateway.deployments.openai import UpstreamOutput
from gateway.deps import Gateway
from gateway.errors import AuditUnavailable, GatewayError, InvalidRequest, ResponseNotFound
from gateway.openai.answers import chat_logprobs, joined, usage
from gateway.openai.chat.protocol import ChatCompletionRequest
from gateway.openai.chat.service import answer, chat_ask
from gateway.openai.responses_api.protocol import ResponsesRequest
from gateway.openai.stream import event_stream
from gateway.pipeline.accounting import accounted, finish, recorded
from gateway.pipeline.admission import Admitted, admit
from gateway.pipeline.execution import collect

ROUTE = "responses"
# Chat's names for fields that have other names here, for the errors chat's checks raise.
_CHAT_FIELDS = {"max_completion_tokens": ("max_output_tokens",), "response_format": ("text", "format")}


def chat_request(body: ResponsesRequest, previous: Sequence[dict] = ()) -> ChatCompletionRequest:
    """The chat request that runs this one (after the previous conversation). What chat refuses
    is refused here with chat's error, at the field of this request it came from."""
    wire, origins = body.chat_body(previous)
    try:
        return ChatCompletionRequest.model_validate(wire)
    except ValidationError as exc:
        raise RequestValidationError([error | {"loc": ("body", *_origin(error["loc"], origins))}
                                      for error in exc.errors()]) from None


def _origin(loc: tuple, origins: list[tuple]) -> tuple:
    if len(loc) >= 2 and loc[0] == "messages" and isinstance(loc[1], int):
        return origins[loc[1]] + tuple(loc[2:])
    if len(loc) >= 3 and loc[0] == "tools" and loc[2] == "function":  # chat nests what is flat here
        return tuple(loc[:2]) + tuple(loc[3:])
    if loc and loc[0] in _CHAT_FIELDS:
        return _CHAT_FIELDS[loc[0]] + tuple(loc[1:])
    return tuple(loc)


def _whole_calls(pieces: list[dict]) -> list[dict]:
    """An upstream's tool calls as whole calls: streamed pieces (with an index) joined, whole ones as they are."""
    calls: dict[object, dict] = {}
    for piece in pieces:
        call = calls.setdefault(piece.get("index", len(calls)),
                                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        call["id"] = piece.get("id") or call["id"]
        function = piece.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""
    return list(calls.values())


def answer_of(chat: ChatCompletionRequest, outputs: list[RequestOutput]) -> tuple[str, list[dict]]:
    """The answer's text and its function calls (as chat's message.tool_calls): read from the text
    as chat reads it, or the upstream's own calls."""
    text, _ = joined(outputs)
    if not chat.active_tools:
        return text, []
    if any(isinstance(o, UpstreamOutput) for o in outputs):
        return text, _whole_calls([c for o in outputs if isinstance(o, UpstreamOutput) for c in o.tool_calls])
    message, _ = answer(chat, text, outputs[-1].finish_reason if outputs else None)
    return message["content"] or "", message["tool_calls"] or []


def assistant_message(text: str, calls: list[dict]) -> dict:
    """The answer as the chat message a stored conversation keeps."""
    if calls:
        return {"role": "assistant", "content": text or None, "tool_calls": calls}
    return {"role": "assistant", "content": text}


def response_usage(admitted: Admitted) -> dict:
    counts = usage(admitted)  # chat's figures, with its rule for cached tokens in the shared scope
    return {"input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": counts["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": counts["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"]}


class ResponseRenderer:
    """The response object and its output message, as they stand at each point of a request."""

    def __init__(self, body: ResponsesRequest, admitted: Admitted, *, stored: bool, token_text=None) -> None:
        self.body = body
        self.token_text = token_text  # with include's logprobs: the model's token text, for each entry
        self.admitted = admitted
        self.stored = stored
        self.id = admitted.request_id
        self.message_id = "msg_" + self.id.removeprefix("resp_")

    @property
    def incomplete(self) -> bool:
        return self.admitted.finish_reason == "length"  # max_output_tokens, or the policy's cap on it

    def logprobs(self, outputs: list[RequestOutput]) -> list[dict]:
        """The output text's logprobs, chat's entries, when `include` asks for them; else none."""
        if self.token_text is None:
            return []
        return chat_logprobs(self.token_text, [lp for o in outputs for lp in o.logprobs])

    def part(self, text: str, logprobs: list[dict] | None = None) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}

    @property
    def status(self) -> str:
        return "incomplete" if self.incomplete else "completed"

    def message(self, text: str | None, logprobs: list[dict] | None = None) -> dict:
        """The output message; text None: still being written."""
        return {"id": self.message_id, "type": "message", "status": "in_progress" if text is None else self.status,
                "role": "assistant", "content": [] if text is None else [self.part(text, logprobs)]}

    def output(self, text: str, calls: list[dict], outputs: list[RequestOutput] = ()) -> list[dict]:
        """The output items: the message (unless the answer is calls alone), then one function_call per call."""
        return ([self.message(text, self.logprobs(list(outputs)))] if text or not calls else []) + [
            {"id": "fc_" + uuid.uuid4().hex, "type": "function_call", "status": self.status, "call_id": call["id"],
             "name": call["function"]["name"], "arguments": call["function"]["arguments"]} for call in calls]

    def response(self, output: list[dict] | None) -> dict:
        """The response object; output None: in progress, with no output yet."""
        body, done = self.body, output is not None
        status = self.status if done else "in_progress"
        return {
            "id": self.id, "object": "response", "created_at": self.admitted.created, "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "model": body.model,
            "output": output if done else [],
            "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id, "store": self.stored,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {"format": (body.text.format if body.text and body.text.format else None) or {"type": "text"}},
            "tool_choice": "auto" if body.tool_choice is None else body.tool_choice,
            "tools": [tool.model_dump() for tool in body.tools or []],
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "top_logprobs": body.top_logprobs or 0,
            "truncation": "disabled", "usage": response_usage(self.admitted) if done else None,
            "user": body.user, "metadata": body.metadata or {},
        }


def stream_event(payload: dict) -> bytes:
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"event: {payload['type']}\ndata: {data}\n\n".encode()


def _stored_param(body: ResponsesRequest) -> str | None:
    """The field that asks for the store, if any."""
    if body.previous_response_id is not None:
        return "previous_response_id"
    return "store" if body.store else None


# Cache scopes whose stored responses belong to the principal that made them, not to its whole
# tenant: the decision keeps a principal's prompts from its colleagues' caches, so its stored
# conversations too ("none": restricted data, the narrowest owner).
_PRINCIPAL_SCOPES = ("principal", "none")


def _principal_owned(decision) -> bool:
    """Whether a response stored under this decision is its principal's alone (else its tenant's)."""
    return decision.cache.scope in _PRINCIPAL_SCOPES


async def _stored(gateway: Gateway, principal: Principal, response_id: str) -> dict | None:
    """The record stored under this id for this caller: its tenant's, and if it was stored for
    one principal, only that principal's. Anyone else is told it does not exist."""
    digests = gateway.audit.principal_digests(principal)
    record = await gateway.responses_store.get(digests["tenant"], response_id)
    if record is None or record.get("principal", digests["principal"]) != digests["principal"]:
        return None
    return record


async def _previous_conversation(gateway: Gateway, principal: Principal, body: ResponsesRequest) -> list[dict]:
    if body.previous_response_id is None:
        return []
    record = await _stored(gateway, principal, body.previous_response_id)
    if record is None:
        raise ResponseNotFound(param="previous_response_id", code="previous_response_not_found")
    return record["conversation"]


async def create_response(gateway: Gateway, principal: Principal, body: ResponsesRequest,
                          request: Request) -> Response:
    asked = _stored_param(body)
    if asked is not None and gateway.responses_store is None:
        raise InvalidRequest("responses are not stored here: this gateway has no response store", param=asked)
    digests = gateway.audit.principal_digests(principal)
    previous = await _previous_conversation(gateway, principal, body)  # before admission: its tokens count
    chat = chat_request(body, previous)
    response_id = "resp_" + uuid.uuid4().hex
    admitted = await admit(gateway, request, principal, chat_ask(gateway, chat, response_id, route=ROUTE, format_param="text.format"))
    retention = admitted.judgement.decision.responses
    token_text = gateway.models[body.model].tokenizer.token_text if chat.logprobs else None
    render = ResponseRenderer(body, admitted, stored=bool(body.store) and retention.store, token_text=token_text)

    async def keep(text: str, calls: list[dict], output: list[dict]) -> None:
        if render.stored:
            conversation = previous + body.conversation() + [assistant_message(text, calls)]
            record = {"response": render.response(output), "conversation": conversation}
            if _principal_owned(admitted.judgement.decision):
                record["principal"] = digests["principal"]  # sealed with the rest: it cannot be edited out
            await gateway.responses_store.put(digests["tenant"], response_id, record,
                                              ttl_s=retention.retention_days * 86400)

    async def forget() -> None:
        """Undoes keep() when the request's record could not be kept: the request is refused, so
        neither it nor what it stored may be acknowledged."""
        if render.stored:
            await gateway.responses_store.delete(digests["tenant"], response_id)

    with accounted(gateway, admitted):
        if asked is not None and not retention.store:
            raise InvalidRequest("this tenant's policy does not allow stored responses (for this data "
                                 "classification); send the conversation as input items", param=asked)
        if body.stream:
            return await _stream(gateway, admitted, request, chat, render, keep, forget)
        outputs = await collect(gateway, admitted, request)
        text, calls = answer_of(chat, outputs)
        output = render.output(text, calls, outputs)
        await keep(text, calls, output)
        try:
            await recorded(finish(gateway, admitted, status=200, outcome="completed"))
        except AuditUnavailable:
            await forget()
            raise
        return JSONResponse(render.response(output), headers={"X-Request-Id": response_id})


async def retrieve_response(gateway: Gateway, principal: Principal, response_id: str) -> Response:
    """A stored response, to its own tenant only (its own principal only, where the decision scoped it so)."""
    record = None
    if gateway.responses_store is not None:
        record = await _stored(gateway, principal, response_id)
    if record is None:
        raise ResponseNotFound()
    return JSONResponse(record["response"])


async def _stream(gateway: Gateway, admitted: Admitted, request: Request, chat: ChatCompletionRequest,
                  render: ResponseRenderer, keep: Callable[[str, list[dict], list[dict]], Awaitable[None]],
                  forget: Callable[[], Awaitable[None]]) -> Response:
    """The Responses API's events, in its order, numbered from 0. With tools the answer is read
    whole (a call or text, as chat's auto and required are): its items' events all come at the end."""
    sequence = itertools.count()
    held: list[RequestOutput] = []  # the outputs; with tools, nothing is sent until the last
    tools = bool(chat.active_tools)
    at = {"item_id": render.message_id, "output_index": 0, "content_index": 0}
    answered: dict = {}  # text, calls and output items, once the outputs are done

    def encode(event: dict) -> bytes:
        return stream_event(event | {"sequence_number": next(sequence)})

    def message_opening() -> list[dict]:
        return [{"type": "response.output_item.added", "output_index": 0, "item": render.message(None)},
                {"type": "response.content_part.added", **at, "part": render.part("")}]

    def text_delta(text: str, logprobs: list[dict] | None = None) -> list[dict]:
        return [{"type": "response.output_text.delta", **at, "delta": text, "logprobs": logprobs or []}] if text else []

    def opening() -> list[dict]:
        return [{"type": "response.created", "response": render.response(None)},
                {"type": "response.in_progress", "response": render.response(None)},
                *([] if tools else message_opening())]

    def deltas(output) -> list[dict]:
        held.append(output)
        return [] if tools else text_delta(output.new_text, render.logprobs([output]))

    def item_events(index: int, item: dict) -> list[dict]:
        if item["type"] == "message":
            text, logprobs = item["content"][0]["text"], item["content"][0]["logprobs"]
            return [*(message_opening() if tools else []), *(text_delta(text, logprobs) if tools else []),
                    {"type": "response.output_text.done", **at, "text": text, "logprobs": logprobs},
                    {"type": "response.content_part.done", **at, "part": item["content"][0]},
                    {"type": "response.output_item.done", "output_index": 0, "item": item}]
        call = {"item_id": item["id"], "output_index": index}
        return [{"type": "response.output_item.added", "output_index": index,
                 "item": item | {"arguments": "", "status": "in_progress"}},
                {"type": "response.function_call_arguments.delta", **call, "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", **call, "arguments": item["arguments"]},
                {"type": "response.output_item.done", "output_index": index, "item": item}]

    def closing() -> list[dict]:
        text, calls = answer_of(chat, held)
        answered.update(text=text, calls=calls, output=render.output(text, calls, held))
        return [event for index, item in enumerate(answered["output"]) for event in item_events(index, item)]

    def done() -> bytes:
        kind = "response.incomplete" if render.incomplete else "response.completed"
        return encode({"type": kind, "response": render.response(answered["output"])})

    def failed(error: GatewayError) -> dict:
        return {"type": "error", "code": error.code, "message": error.message, "param": error.param}

    return await event_stream(gateway, admitted, request, deltas, opening=opening, closing=closing,
                              failed=failed, encode=encode, done=done,
                              finishing=lambda: keep(answered["text"], answered["calls"], answered["output"]),
                              unfinishing=forget)
