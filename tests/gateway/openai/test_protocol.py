"""Text that is not Unicode (a JSON escape of a lone surrogate, \\ud800-\\udfff) anywhere in a
request is refused at the edge with a 400 naming the field, before it reaches a tokenizer, a
stop matcher or a log; the real `tenantgate serve` process logs no exception for any of it."""

from __future__ import annotations

import json

import httpx
import openai

from devkit.server import tenantgate_serve
from tests.gateway.api.conftest import ALPHA, AUDIENCE, serve_env

LONE = "\ud800"
CHAT = {"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "hello"}]}
COMPLETION = {"model": "demo", "max_tokens": 2, "prompt": "hello"}
PATHS = {"chat": "/chat/completions", "completions": "/completions"}

# (route, body, the field the error must name)
CASES = [
    ("chat", CHAT | {"messages": [{"role": "user", "content": f"hi {LONE} there"}]}, "messages.0.content"),
    ("chat", CHAT | {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
     "messages.0.content"),
    ("chat", CHAT | {"messages": [{"role": "user", "content": "hi", "name": LONE}]}, "messages.0.name"),
    ("chat", CHAT | {"messages": [{"role": "user", "content": "hi"},
                                  {"role": "tool", "content": "42", "tool_call_id": f"call{LONE}"}]},
     "messages.1.tool_call_id"),
    ("chat", CHAT | {"stop": f"end{LONE}"}, "stop"),
    ("chat", CHAT | {"stop": ["ok", LONE]}, "stop"),
    ("chat", CHAT | {"user": LONE}, "user"),
    ("chat", CHAT | {"metadata": {"note": LONE}}, "metadata"),
    ("chat", CHAT | {"metadata": {LONE: "note"}}, "metadata"),
    ("chat", CHAT | {"model": f"demo{LONE}"}, "model"),
    ("completions", COMPLETION | {"prompt": f"a{LONE}"}, "prompt"),
    ("completions", COMPLETION | {"prompt": [f"a{LONE}"]}, "prompt"),
    ("completions", COMPLETION | {"stop": ["\udc00"]}, "stop"),
    ("completions", COMPLETION | {"user": LONE}, "user"),
]


def test_lone_surrogates_are_400_naming_the_field_and_never_logged(local_issuer, demo_model_dir, tmp_path) -> None:
    # The demo engine: its real tokenizer and stop matcher are what lone surrogates must not reach.
    env = serve_env(local_issuer, TENANTGATE_ENGINE="embedded", TENANTGATE_MODEL="demo",
                    TENANTGATE_KV_CACHE_MEMORY_BYTES=str(32 << 20), TENANTGATE_AUDIT_STDOUT="true")
    headers = {"Authorization": f"Bearer {local_issuer.mint(ALPHA, audience=AUDIENCE)}",
               "Content-Type": "application/json"}
    wrong = []
    with tenantgate_serve(tmp_path, env, "--log-level", "debug") as server:
        def post(route: str, body: dict) -> httpx.Response:
            # json.dumps writes each lone surrogate as its \uXXXX escape: valid JSON, invalid text.
            # A connection each: a 500 closes its connection, which would fail the next request.
            return httpx.post(server.base_url + "/v1" + PATHS[route], content=json.dumps(body), headers=headers,
                              timeout=60)

        assert post("chat", CHAT).status_code == 200
        for route, body, field in CASES:
            response = post(route, body)
            error = response.json().get("error", {}) if response.status_code != 200 else {}
            if response.status_code != 400 or error.get("param") != field:
                wrong.append((route, field, response.status_code, error.get("param")))
            elif not error["message"].startswith(f"{field}: "):
                wrong.append((route, field, "message", error["message"]))
    assert wrong == [], wrong

    logs = server.stderr.read_text() + server.stdout.read_text()
    assert "GET /readyz" in logs  # the logs were captured
    for needle in ("Traceback", "Exception", "Error:", "surrogate", "TextInputSequence", "ERROR"):
        assert needle not in logs, f"{needle!r} in the server's output"


def nested_schema(levels: int) -> dict:
    """A schema whose objects nest `levels` deep (each property wrapper is two: the object and its properties)."""
    schema: dict = {"type": "boolean"}
    for _ in range(levels // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


DEEP = nested_schema(300)  # 2.5 KB of JSON: within the policy's byte bound, far beyond any depth
# (route, body, the field the error must name)
DEEP_CASES = [
    ("chat", CHAT | {"response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": DEEP}}},
     "response_format.json_schema.json_schema.schema"),
    ("chat", CHAT | {"tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]},
     "tools.0.function.parameters"),
    ("responses", {"model": "demo", "input": "hello", "max_output_tokens": 2,
                   "text": {"format": {"type": "json_schema", "name": "deep", "schema": DEEP}}}, "text.format"),
    ("responses", {"model": "demo", "input": "hello", "max_output_tokens": 2,
                   "tools": [{"type": "function", "name": "f", "parameters": DEEP}]}, "tools.0.parameters"),
]


def test_a_schema_nested_300_levels_deep_is_400_naming_the_field_and_never_logged(local_issuer, tmp_path) -> None:
    # Decided before anything walks the schema: no RecursionError, no 500, no traceback in the log.
    env = serve_env(local_issuer, TENANTGATE_AUDIT_STDOUT="true")
    wrong = []
    with tenantgate_serve(tmp_path, env, "--log-level", "debug") as server:
        with openai.OpenAI(base_url=server.base_url + "/v1", api_key=local_issuer.mint(ALPHA, audience=AUDIENCE),
                           max_retries=0, timeout=60) as client:
            for route, body, field in DEEP_CASES:
                create = client.chat.completions.create if route == "chat" else client.responses.create
                try:
                    create(**body)
                    wrong.append((route, field, 200))
                except openai.APIStatusError as exc:
                    error = exc.body if isinstance(exc.body, dict) else {}
                    if exc.status_code != 400 or error.get("param") != field:
                        wrong.append((route, field, exc.status_code, error.get("param")))
                    elif "nests more than 64 levels" not in error["message"]:
                        wrong.append((route, field, error["message"]))
    assert wrong == [], wrong

    logs = server.stderr.read_text() + server.stdout.read_text()
    assert "POST /v1/responses" in logs  # the logs were captured
    for needle in ("Traceback", "RecursionError", "ERROR"):
        assert needle not in logs, f"{needle!r} in the server's output"
