"""What every flow script shares: the gateway it talks to, and its report.

A flow runs with a client library's own python (.venv-clients/NAME), never the gateway's; it
imports nothing of tenantgate. Each check is a function whose result (a JSON value) or exception
goes into the one JSON object the script prints, under the check's name.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable

BASE_URL = os.environ["TENANTGATE_BASE_URL"]  # ends in /v1
TOKEN = os.environ["TENANTGATE_TOKEN"]
SMALL_BUDGET_TOKEN = os.environ.get("TENANTGATE_SMALL_BUDGET_TOKEN", "")
MODEL = os.environ["TENANTGATE_MODEL"]
EMBEDDING_MODEL = os.environ["TENANTGATE_EMBEDDING_MODEL"]
CONTEXT_TOKENS = int(os.environ["TENANTGATE_CONTEXT_TOKENS"])

# A tool whose arguments the schema decides: one key, one allowed value, nothing else.
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris"]}},
                      "required": ["city"], "additionalProperties": False}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                                 "parameters": WEATHER_PARAMETERS}}

_checks: dict[str, Callable[[], object]] = {}


def check(function: Callable[[], object]) -> Callable[[], object]:
    _checks[function.__name__] = function
    return function


def failure(exc: BaseException) -> dict:
    """An exception as the report holds it: its class, HTTP status, message and (if any) body."""
    response = getattr(exc, "response", None)
    headers = dict(getattr(response, "headers", None) or {}) if response is not None else {}
    return {"error": {"class": type(exc).__name__, "module": type(exc).__module__,
                      "mro": [cls.__name__ for cls in type(exc).__mro__],
                      "status": getattr(exc, "status_code", None), "message": str(exc)[:2000],
                      "code": getattr(exc, "code", None),
                      "headers": {k.lower(): v for k, v in headers.items()}}}


def run() -> None:
    wanted = set(sys.argv[1:]) or set(_checks)
    report = {}
    for name, function in _checks.items():
        if name not in wanted:
            continue
        started = time.monotonic()
        try:
            report[name] = {"result": function()}
        except Exception as exc:  # noqa: BLE001 - the report says what the library raised
            report[name] = failure(exc)
            print(f"{name}:\n{traceback.format_exc()}", file=sys.stderr)
        report[name]["seconds"] = round(time.monotonic() - started, 2)
    print(json.dumps(report, default=str))
