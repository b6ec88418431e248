"""From an OpenAI request body to the pipeline's Ask: refuse what no deployment can do, count
and encode the prompt with the model's tokenizer (or estimate it where the gateway has none)."""

from __future__ import annotations

from collections.abc import Callable

from gateway.context import Gateway
from gateway.deployments.dialects import unsupported_fields
from gateway.deployments.registry import Tokenizer
from gateway.deployments.targets import UpstreamTarget
from gateway.errors import InvalidRequest
from gateway.openai.protocol import SamplingFields
from gateway.pipeline.admission import Ask

# Without the model's tokenizer a prompt is counted as one token per this many UTF-8 bytes: a
# typical BPE on English text. The budget settles on the upstream's own count afterwards.
BYTES_PER_TOKEN_ESTIMATE = 4


def unsupported(body: SamplingFields) -> None:
    """OpenAI fields the engine has no equivalent for: refused, never silently ignored."""
    if body.seed is not None and not 0 <= body.seed < 2**63:
        raise InvalidRequest("seed must be an integer in [0, 2**63)", param="seed")


def logprob_text(gateway: Gateway, model: str) -> Callable[[int], str]:
    """The text of a token id, for logprobs: only a model the gateway has the tokenizer of takes them
    (build_ask refuses logprobs for one whose upstreams get text)."""
    tokenizer = gateway.models[model].tokenizer
    if tokenizer is None:
        raise InvalidRequest("logprobs are not available for this model", param="logprobs")
    return tokenizer.token_text


def estimate_tokens(text: str) -> int:
    return max(1, -(-len(text.encode()) // BYTES_PER_TOKEN_ESTIMATE))


def build_ask(gateway: Gateway, body: SamplingFields, *, route: str, request_id: str, runs_as: str | None = None,
              encode: Callable[[Tokenizer], list[int]], text: Callable[[], str], max_tokens: int | None,
              logprobs: int | None, special_token_ids: Callable[[Tokenizer], list[int]] | None = None,
              json_schema: str | None = None, schema_param: str = "response_format") -> Ask:
    """`encode(tokenizer)`: the prompt's ids with the model's tokenizer; `text()`: the prompt as text,
    for models the gateway has no tokenizer for."""
    unsupported(body)
    served = gateway.models.get(body.model)
    wire = body.model_dump(mode="json", exclude_none=True, by_alias=True)  # json_schema's `schema`
    token_ids, prompt_tokens, special = [], 0, None
    if served is not None:
        if not served.takes_token_ids:
            if logprobs is not None:
                raise InvalidRequest("logprobs are not available for this model", param="logprobs")
            dialects = [t.deployment.dialect for t in served.targets if isinstance(t, UpstreamTarget)]
            refused = unsupported_fields(wire, [dialect for dialect in dialects if dialect is not None])
            if "n" in refused:
                raise InvalidRequest("n must be 1 for this model: its upstream deployments return one choice "
                                     "per request here (docs/upstreams.md)", param="n")
            if refused:
                raise InvalidRequest(f"{refused[0]} is not supported for this model", param=refused[0])
        tokenizer = served.tokenizer
        if tokenizer is not None:
            token_ids = encode(tokenizer)
            prompt_tokens = len(token_ids)
            if special_token_ids is not None:
                special = lambda: special_token_ids(tokenizer)  # noqa: E731 - bound to this model
        else:
            prompt_tokens = estimate_tokens(text())
        if not served.takes_token_ids:
            token_ids = []
    return Ask(route=route, runs_as=runs_as, request_id=request_id, model=body.model, stream=body.stream,
               prompt_tokens=prompt_tokens, token_ids=token_ids, max_tokens=max_tokens, n=body.n,
               temperature=body.temperature, top_p=body.top_p, seed=body.seed, stop=body.stop_list(),
               top_k=body.top_k, min_p=body.min_p, presence_penalty=body.presence_penalty,
               frequency_penalty=body.frequency_penalty, logit_bias=body.logit_bias,
               logprobs=logprobs, json_schema=json_schema, schema_param=schema_param, body=wire,
               special_token_ids=special)
