"""Text completions: encode the prompt (or take its token ids), admit it, answer."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from gateway.auth.principal import Principal
from gateway.deps import Gateway
from gateway.errors import InvalidRequest
from gateway.openai.completions.protocol import CompletionRequest
from gateway.openai.responses import completion_logprobs, finish_reason, joined, system_fingerprint, usage
from gateway.openai.serving import accounted, admit, collect, finish, new_request_id
from gateway.openai.stream import sse_response

ROUTE = "completions"


def prompt_token_ids(gateway: Gateway, body: CompletionRequest, *, parse_special: bool = False) -> list[int]:
    """The prompt's ids; special-token strings in a text prompt stay text unless parse_special."""
    prompt = body.prompt_value()
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("the prompt is empty", param="prompt")
        return gateway.backend.encode(prompt, add_special_tokens=True, parse_special=parse_special)
    return list(prompt)


async def create_completion(gateway: Gateway, principal: Principal, body: CompletionRequest,
                            request: Request) -> Response:
    request_id = new_request_id("cmpl")
    token_ids = prompt_token_ids(gateway, body) if body.model == gateway.backend.model_name else []
    admitted = await admit(gateway, request, principal, body, route=ROUTE, request_id=request_id,
                           token_ids=token_ids, requested_max_tokens=body.max_tokens, logprobs=body.logprobs,
                           special_token_ids=lambda: prompt_token_ids(gateway, body, parse_special=True))
    fingerprint = system_fingerprint(gateway.backend.fingerprint)
    base = {"id": request_id, "object": "text_completion", "created": admitted.created, "model": body.model,
            "system_fingerprint": fingerprint}
    with accounted(gateway, admitted):
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            if include_usage:
                base["usage"] = None
            offset = [0]

            def chunks(output) -> list[dict]:
                if not (output.new_text or output.logprobs or output.finished):
                    return []
                logprobs = None
                if body.logprobs is not None:
                    logprobs = completion_logprobs(gateway.backend.token_text, output.logprobs, offset[0])
                offset[0] += len(output.new_text)
                return [base | {"choices": [{"index": 0, "text": output.new_text, "logprobs": logprobs,
                                             "finish_reason": finish_reason(output.finish_reason)}]}]

            return await sse_response(gateway, admitted, request, chunks,
                                      base | {"choices": []} if include_usage else None)

        outputs = await collect(gateway, admitted, request)
        text, token_logprobs = joined(outputs)
        choice = {"index": 0, "text": text, "finish_reason": finish_reason(admitted.finish_reason),
                  "logprobs": completion_logprobs(gateway.backend.token_text, token_logprobs, 0)
                  if body.logprobs is not None else None}
        finish(gateway, admitted, status=200, outcome="completed")
        return JSONResponse(base | {"choices": [choice], "usage": usage(admitted)},
                            headers={"X-Request-Id": request_id})
