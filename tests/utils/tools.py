"""External tools the tests run (redis-server, opa, tflint): where to find one built with Go, and
what to do when one is missing."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from devkit.gotools import find_go_binary

__all__ = ["find_go_binary", "missing_tool"]


def missing_tool(message: str) -> NoReturn:
    """Skips locally; fails in CI and under TENANTGATE_REQUIRE_TOOLS=1 (`make test`), where the
    install scripts have put every tool in place and a skip would hide an unchecked part."""
    if os.environ.get("CI", "").lower() == "true" or os.environ.get("TENANTGATE_REQUIRE_TOOLS") == "1":
        pytest.fail(message)
    pytest.skip(message)


