"""LiteLLM as a client (its OpenAI provider at the gateway's api_base): completion, streaming, a
forced tool call, the answer sent back on the next turn, and a prompt over the context window,
which LiteLLM must raise as ContextWindowExceededError for its fallbacks to fire."""

from __future__ import annotations

import json

import litellm

from _flow import BASE_URL, CONTEXT_TOKENS, MODEL, TOKEN, WEATHER_TOOL, check, run

litellm.telemetry = False
OPTIONS = {"model": f"openai/{MODEL}", "api_base": BASE_URL, "api_key": TOKEN, "temperature": 0,
           "num_retries": 0, "timeout": 120}
HELLO = [{"role": "user", "content": "Say hello."}]


@check
def completion() -> dict:
    response = litellm.completion(messages=HELLO, max_tokens=8, **OPTIONS)
    return {"content_is_text": isinstance(response.choices[0].message.content, str),
            "finish_reason": response.choices[0].finish_reason, "completion_tokens": response.usage.completion_tokens}


@check
def streaming() -> dict:
    chunks = list(litellm.completion(messages=HELLO, max_tokens=8, stream=True, **OPTIONS))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return {"chunks": len(chunks), "text_is_empty": text == "",
            "finish_reason": next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices[0].finish_reason)}


@check
def tools() -> dict:
    response = litellm.completion(messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                  tools=[WEATHER_TOOL], max_tokens=24,
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}}, **OPTIONS)
    call = response.choices[0].message.tool_calls[0]
    return {"name": call.function.name, "arguments": json.loads(call.function.arguments)}


@check
def multi_turn_append() -> dict:
    messages: list = list(HELLO)
    first = litellm.completion(messages=messages, max_tokens=8, **OPTIONS)
    messages += [first.choices[0].message, {"role": "user", "content": "Say it again."}]
    second = litellm.completion(messages=messages, max_tokens=8, **OPTIONS)
    return {"second_finish": second.choices[0].finish_reason}


@check
def context_window_exceeded() -> dict:
    try:
        litellm.completion(messages=[{"role": "user", "content": "word " * (CONTEXT_TOKENS * 2)}], max_tokens=8,
                           **OPTIONS)
    except litellm.ContextWindowExceededError as exc:
        return {"raised": "ContextWindowExceededError", "status": exc.status_code}
    except litellm.APIError as exc:
        return {"raised": type(exc).__name__, "status": getattr(exc, "status_code", None), "message": str(exc)[:500]}
    raise AssertionError("the prompt was admitted")


if __name__ == "__main__":
    run()
