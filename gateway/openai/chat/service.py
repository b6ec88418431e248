"""Chat completions: render the conversation, admit it, answer as JSON or as SSE chunks (render.py)."""

from __future__ import annotations

from fastapi.responses import Response

from engine import TokenizerError
from gateway.auth.principal import Principal
from gateway.context import Gateway
from gateway.deployments.registry import Tokenizer
from gateway.errors import InvalidRequest
from gateway.openai.asks import build_ask, logprob_text
from gateway.openai.chat.protocol import ChatCompletionRequest, schema_of
from gateway.openai.chat.render import ChatRenderer
from gateway.openai.chat.tools import constrained_schema
from gateway.openai.responder import respond
from gateway.pipeline.admission import Ask, admit, new_request_id
from gateway.pipeline.exchange import Exchange
from gateway.pipeline.run import Run

ROUTE = "chat.completions"


def prompt_token_ids(tokenizer: Tokenizer, body: ChatCompletionRequest) -> list[int]:
    try:
        # Only the template's own control tokens are special; message text that spells one stays text.
        tools = [t.model_dump(exclude_none=True) for t in body.active_tools] if tokenizer.renders_tools else None
        return tokenizer.encode_chat(body.template_messages(tools_in_system=not tokenizer.renders_tools),
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
                     encode=lambda tokenizer: prompt_token_ids(tokenizer, body), text=lambda: prompt_text(body),
                     max_tokens=body.requested_max_tokens, logprobs=logprobs,
                     # A forced call's answer is its arguments, held to the tool's parameters; response_format
                     # holds every other answer (the one after the tool's result, under auto or none).
                     json_schema=constrained_schema(body.active_tools, body.tool_choice, body.parallel_calls)
                     or schema_of(body.response_format),
                     schema_param="tools" if body.constrains_tool_call else format_param)


async def create_chat_completion(gateway: Gateway, exchange: Exchange, principal: Principal,
                                 body: ChatCompletionRequest) -> Response:
    ask = chat_ask(gateway, body, new_request_id("chatcmpl"))
    run = Run(gateway, await admit(gateway, exchange, principal, ask), exchange)
    token_text = logprob_text(gateway, body.model) if ask.logprobs is not None else None
    return await respond(run, ChatRenderer(run, body, token_text), stream=body.stream)
