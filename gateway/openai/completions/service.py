"""Text completions: encode the prompt (or take its token ids), admit it, answer."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from gateway.auth.principal import Principal
from gateway.deployments.registry import ServedModel
from gateway.deps import Gateway
from gateway.errors import InvalidRequest
from gateway.openai.answers import completion_logprobs, finish_reason, joined_by_choice, system_fingerprint, usage
from gateway.openai.asks import build_ask
from gateway.openai.completions.protocol import CompletionRequest
from gateway.openai.stream import sse_response
from gateway.pipeline.accounting import accounted, finish, recorded
from gateway.pipeline.admission import admit, new_request_id
from gateway.pipeline.execution import collect

ROUTE = "completions"


def prompt_token_ids(served: ServedModel, body: CompletionRequest, *, parse_special: bool = False) -> list[int]:
    """The prompt's ids; special-token strings in a text prompt stay text unless parse_special."""
    prompt = body.prompt_value()
    if isinstance(prompt, str):
        return served.tokenizer.encode(prompt, add_special_tokens=True, parse_special=parse_special)
    return list(prompt)


def prompt_text(body: CompletionRequest) -> str:
    prompt = body.prompt_value()
    if not isinstance(prompt, str):
        raise InvalidRequest("this model takes text prompts only, not token ids", param="prompt")
    return prompt


async def create_completion(gateway: Gateway, principal: Principal, body: CompletionRequest,
                            request: Request) -> Response:
    if body.prompt_value() == "":
        raise InvalidRequest("the prompt is empty", param="prompt")
    request_id = new_request_id("cmpl")
    ask = build_ask(gateway, body, route=ROUTE, request_id=request_id,
                    encode=lambda served: prompt_token_ids(served, body), text=lambda: prompt_text(body),
                    max_tokens=body.max_tokens, logprobs=body.logprobs,
                    special_token_ids=lambda served: prompt_token_ids(served, body, parse_special=True))
    admitted = await admit(gateway, request, principal, ask)
    token_text = gateway.models[body.model].tokenizer.token_text if body.logprobs is not None else None

    def base() -> dict:
        return {"id": request_id, "object": "text_completion", "created": admitted.created, "model": body.model,
                "system_fingerprint": system_fingerprint(admitted)}

    with accounted(gateway, admitted):
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            extra = {"usage": None} if include_usage else {}
            offsets = [0] * body.n  # each choice's text so far

            def chunks(output) -> list[dict]:
                if not (output.new_text or output.logprobs or output.finished):
                    return []
                logprobs = None
                if body.logprobs is not None:
                    logprobs = completion_logprobs(token_text, output.logprobs, offsets[output.index])
                offsets[output.index] += len(output.new_text)
                return [base() | extra | {"choices": [{"index": output.index, "text": output.new_text,
                                                       "logprobs": logprobs,
                                                       "finish_reason": finish_reason(output.finish_reason)}]}]

            return await sse_response(gateway, admitted, request, chunks,
                                      (lambda: base() | {"choices": []}) if include_usage else None)

        outputs = await collect(gateway, admitted, request)
        choices = [{"index": index, "text": text, "finish_reason": finish_reason(admitted.finish_reasons.get(index)),
                    "logprobs": completion_logprobs(token_text, token_logprobs, 0)
                    if body.logprobs is not None else None}
                   for index, (text, token_logprobs) in enumerate(joined_by_choice(outputs, body.n))]
        await recorded(finish(gateway, admitted, status=200, outcome="completed"))
        return JSONResponse(base() | {"choices": choices, "usage": usage(admitted)},
                            headers={"X-Request-Id": request_id})
