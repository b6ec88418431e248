"""Chat completions: render the conversation, admit it, answer as JSON or as SSE chunks."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine import TokenizerError
from gateway.auth.principal import Principal
from gateway.deployments.openai import UpstreamOutput
from gateway.deployments.registry import ServedModel
from gateway.deps import Gateway
from gateway.errors import InvalidRequest
from gateway.openai.answers import chat_logprobs, finish_reason, joined_by_choice, system_fingerprint, usage
from gateway.openai.asks import build_ask
from gateway.openai.chat.protocol import ChatCompletionRequest, schema_of
from gateway.openai.chat.tools import AutoCalls, NamedToolChoice, constrained_schema, new_call_id, parse_calls
from gateway.openai.stream import sse_response
from gateway.pipeline.accounting import accounted, finish, recorded
from gateway.pipeline.admission import Ask, admit, new_request_id
from gateway.pipeline.execution import collect

ROUTE = "chat.completions"


def prompt_token_ids(served: ServedModel, body: ChatCompletionRequest) -> list[int]:
    try:
        # Only the template's own control tokens are special; message text that spells one stays text.
        tools = [t.model_dump(exclude_none=True) for t in body.active_tools] if served.tokenizer.renders_tools else None
        return served.tokenizer.encode_chat(body.template_messages(tools_in_system=not served.tokenizer.renders_tools),
                                            tools=tools or None)
    except TokenizerError:
        # The template's own message may quote the conversation; say what failed, not what it saw.
        raise InvalidRequest("the messages cannot be rendered with this model's chat template "
                             "(check the order of roles)", param="messages") from None


def prompt_text(body: ChatCompletionRequest) -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in body.template_messages())


def chat_ask(gateway: Gateway, body: ChatCompletionRequest, request_id: str, *, route: str = ROUTE,
             format_param: str = "response_format") -> Ask:
    """The pipeline's Ask for a chat request. `route` is what the policy and the audit record see
    (another endpoint that runs as chat names itself, and names its response_format field
    `format_param` in errors); deployments run it as chat completions."""
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    return build_ask(gateway, body, route=route, runs_as=ROUTE, request_id=request_id,
                     encode=lambda served: prompt_token_ids(served, body), text=lambda: prompt_text(body),
                     max_tokens=body.requested_max_tokens, logprobs=logprobs,
                     # A forced call's answer is its arguments, held to the tool's parameters; response_format
                     # holds every other answer (the one after the tool's result, under auto or none).
                     json_schema=constrained_schema(body.active_tools, body.tool_choice, body.parallel_calls)
                     or schema_of(body.response_format),
                     schema_param="tools" if body.constrains_tool_call else format_param)


def answer(body: ChatCompletionRequest, text: str, reason: str | None) -> tuple[dict, str | None]:
    """The assistant message for the engine's answer to `body`, and its finish_reason (OpenAI's:
    tool_calls for the calls the model chose, stop for a named function's). /v1/responses reads
    its function calls from the same message."""
    tools = body.active_tools
    calls, content = parse_calls(text, tools, body.tool_choice, body.parallel_calls) if tools else (None, text)
    message = {"role": "assistant", "content": content, "refusal": None, "tool_calls": calls}
    if calls and reason == "stop" and not isinstance(body.tool_choice, NamedToolChoice):
        return message, "tool_calls"
    return message, finish_reason(reason)


async def create_chat_completion(gateway: Gateway, principal: Principal, body: ChatCompletionRequest,
                                 request: Request) -> Response:
    request_id = new_request_id("chatcmpl")
    ask = chat_ask(gateway, body, request_id)
    logprobs = ask.logprobs
    admitted = await admit(gateway, request, principal, ask)
    token_text = gateway.models[body.model].tokenizer.token_text if logprobs is not None else None

    def base() -> dict:
        return {"id": request_id, "object": "chat.completion.chunk", "created": admitted.created,
                "model": body.model, "system_fingerprint": system_fingerprint(admitted)}

    tools = body.active_tools

    with accounted(gateway, admitted):
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            extra = {"usage": None} if include_usage else {}

            held: list[str] = []  # under `required` the answer is read whole: its calls
            # Under `auto`, content streams as it is generated until a call's marker, then each call as it closes.
            reader = AutoCalls(tools, body.parallel_calls) if body.reads_calls_as_generated else None
            # A named function's answer is its arguments from the first token: they stream as OpenAI's do,
            # the call's id and name first, then the arguments as they come.
            named = bool(tools) and isinstance(body.tool_choice, NamedToolChoice)
            call_id, opened = new_call_id(), False

            def call_delta(fields: dict) -> dict:
                return base() | extra | {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0} | fields]},
                                                      "logprobs": None, "finish_reason": None}]}

            def chunks(output) -> list[dict]:
                nonlocal opened
                out = []
                if tools and isinstance(output, UpstreamOutput):  # the upstream's calls, as they come
                    delta = {"content": output.new_text} if output.new_text else {}
                    if output.tool_calls:
                        delta["tool_calls"] = output.tool_calls
                    if delta:
                        out.append(base() | extra | {"choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                                  "finish_reason": None}]})
                    if output.finished:
                        out.append(base() | extra | {"choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                                  "finish_reason": finish_reason(output.finish_reason)}]})
                    return out
                if named:
                    if not opened:
                        opened = True
                        out.append(call_delta({"id": call_id, "type": "function",
                                               "function": {"name": body.tool_choice.function.name, "arguments": ""}}))
                    if output.new_text:
                        out.append(call_delta({"function": {"arguments": output.new_text}}))
                    if output.finished:
                        out.append(base() | extra | {"choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                                  "finish_reason": finish_reason(output.finish_reason)}]})
                    return out
                if reader is not None:
                    content, made = reader.feed(output.new_text)
                    content += reader.finish() if output.finished else ""
                    if content:
                        out.append(base() | extra | {"choices": [{"index": 0, "delta": {"content": content},
                                                                  "logprobs": None, "finish_reason": None}]})
                    if made:
                        first = len(reader.calls) - len(made)
                        out.append(base() | extra | {"choices": [{"index": 0, "delta": {"tool_calls": [
                            call | {"index": first + i} for i, call in enumerate(made)]}, "logprobs": None,
                            "finish_reason": None}]})
                    if output.finished:
                        reason = ("tool_calls" if reader.calls and output.finish_reason == "stop"
                                  else finish_reason(output.finish_reason))
                        out.append(base() | extra | {"choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                                  "finish_reason": reason}]})
                    return out
                if tools:
                    held.append(output.new_text)
                    if not output.finished:
                        return out
                    message, reason = answer(body, "".join(held), output.finish_reason)
                    delta = ({"tool_calls": [c | {"index": i} for i, c in enumerate(message["tool_calls"])]}
                             if message["tool_calls"] else {"content": message["content"]})
                    out.append(base() | extra | {"choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                              "finish_reason": None}]})
                    out.append(base() | extra | {"choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                              "finish_reason": reason}]})
                    return out
                if output.new_text or output.logprobs:
                    choice = {"index": output.index, "delta": {"content": output.new_text}, "finish_reason": None,
                              "logprobs": ({"content": chat_logprobs(token_text, output.logprobs)}
                                           if logprobs is not None else None)}
                    out.append(base() | extra | {"choices": [choice]})
                if output.finished:
                    out.append(base() | extra | {"choices": [{"index": output.index, "delta": {}, "logprobs": None,
                                                              "finish_reason": finish_reason(output.finish_reason)}]})
                return out

            def opening() -> dict:
                return base() | extra | {"choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                                      "logprobs": None, "finish_reason": None}
                                                     for index in range(body.n)]}

            return await sse_response(gateway, admitted, request, chunks,
                                      (lambda: base() | {"choices": []}) if include_usage else None, opening)

        outputs = await collect(gateway, admitted, request)
        choices = []
        # With tools there is one choice (ChatCompletionRequest), and an upstream calls them itself.
        upstream_called = bool(tools) and any(isinstance(o, UpstreamOutput) for o in outputs)
        for index, (text, token_logprobs) in enumerate(joined_by_choice(outputs, body.n)):
            reason = admitted.finish_reasons.get(index)
            if upstream_called:
                calls = [c for o in outputs if isinstance(o, UpstreamOutput) for c in o.tool_calls]
                message = {"role": "assistant", "content": text or None if calls else text, "refusal": None,
                           "tool_calls": calls}
                reason = finish_reason(reason)
            else:
                message, reason = answer(body, text, reason)
            if not message["tool_calls"]:
                del message["tool_calls"]
            choices.append({
                "index": index,
                "message": message,
                "logprobs": {"content": chat_logprobs(token_text, token_logprobs),
                             "refusal": None} if logprobs is not None else None,
                "finish_reason": reason,
            })
        body_out = base() | {"object": "chat.completion", "choices": choices, "usage": usage(admitted)}
        await recorded(finish(gateway, admitted, status=200, outcome="completed"))
        return JSONResponse(body_out, headers={"X-Request-Id": request_id})
