"""Text completions: encode the prompt (or take its token ids), admit it, answer."""

from __future__ import annotations

from fastapi.responses import Response

from engine import RequestOutput, TokenLogprobs
from gateway.auth.principal import Principal
from gateway.context import Gateway
from gateway.deployments.registry import Tokenizer
from gateway.errors import InvalidRequest
from gateway.openai.asks import build_ask, logprob_text
from gateway.openai.completions.protocol import CompletionRequest
from gateway.openai.responder import Renderer, finish_reason, joined_by_choice, respond, system_fingerprint, usage
from gateway.pipeline.admission import admit, new_request_id
from gateway.pipeline.exchange import Exchange
from gateway.pipeline.run import Run

ROUTE = "completions"


def prompt_token_ids(tokenizer: Tokenizer, body: CompletionRequest, *, parse_special: bool = False) -> list[int]:
    """The prompt's ids; special-token strings in a text prompt stay text unless parse_special."""
    prompt = body.prompt_value()
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special_tokens=True, parse_special=parse_special)
    return list(prompt)


def prompt_text(body: CompletionRequest) -> str:
    prompt = body.prompt_value()
    if not isinstance(prompt, str):
        raise InvalidRequest("this model takes text prompts only, not token ids", param="prompt")
    return prompt


def completion_logprobs(token_text, logprobs: list[TokenLogprobs], text_offset: int) -> dict:
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for lp in logprobs:
        text = token_text(lp.token_id)
        tokens.append(text)
        token_logprobs.append(lp.logprob)
        tops.append({token_text(t): p for t, p in lp.top})
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


class CompletionRenderer(Renderer):
    def __init__(self, run: Run, body: CompletionRequest, token_text=None) -> None:
        super().__init__(run)
        self.body = body
        self.token_text = token_text  # with logprobs: the model's text of each token id
        self.extra = {"usage": None} if body.stream_options and body.stream_options.include_usage else {}
        self.offsets = [0] * body.n  # each choice's text so far

    def base(self) -> dict:
        run = self.run
        return {"id": run.request_id, "object": "text_completion", "created": run.admitted.created,
                "model": self.body.model, "system_fingerprint": system_fingerprint(run)}

    def delta(self, output: RequestOutput) -> list[dict]:
        if not (output.new_text or output.logprobs or output.finished):
            return []
        logprobs = None
        if self.token_text is not None:
            logprobs = completion_logprobs(self.token_text, output.logprobs, self.offsets[output.index])
        self.offsets[output.index] += len(output.new_text)
        return [self.base() | self.extra | {"choices": [{"index": output.index, "text": output.new_text,
                                                         "logprobs": logprobs,
                                                         "finish_reason": finish_reason(output.finish_reason)}]}]

    def closing(self) -> list[dict]:
        return [self.base() | {"choices": [], "usage": usage(self.run)}] if self.extra else []

    def whole(self, outputs: list[RequestOutput]) -> dict:
        reasons, token_text = self.run.finish_reasons, self.token_text
        choices = [{"index": index, "text": text, "finish_reason": finish_reason(reasons.get(index)),
                    "logprobs": completion_logprobs(token_text, token_logprobs, 0) if token_text is not None else None}
                   for index, (text, token_logprobs) in enumerate(joined_by_choice(outputs, self.body.n))]
        return self.base() | {"choices": choices, "usage": usage(self.run)}


async def create_completion(gateway: Gateway, exchange: Exchange, principal: Principal,
                            body: CompletionRequest) -> Response:
    if body.prompt_value() == "":
        raise InvalidRequest("the prompt is empty", param="prompt")
    ask = build_ask(gateway, body, route=ROUTE, request_id=new_request_id("cmpl"),
                    encode=lambda tokenizer: prompt_token_ids(tokenizer, body), text=lambda: prompt_text(body),
                    max_tokens=body.max_tokens, logprobs=body.logprobs,
                    special_token_ids=lambda tokenizer: prompt_token_ids(tokenizer, body, parse_special=True))
    run = Run(gateway, await admit(gateway, exchange, principal, ask), exchange)
    token_text = logprob_text(gateway, body.model) if body.logprobs is not None else None
    return await respond(run, CompletionRenderer(run, body, token_text), stream=body.stream)
