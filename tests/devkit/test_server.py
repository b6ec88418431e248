"""The in-process test server: a start-up failure says why, since a session fixture's error is
all that the tests after it show."""

import socket
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI

from devkit.server import ServerStartError, serving


def test_a_failed_start_carries_the_lifespan_error():
    @asynccontextmanager
    async def lifespan(app):
        raise RuntimeError("the policy bundle is unreadable")
        yield

    with pytest.raises(ServerStartError) as failure:
        with serving(FastAPI(lifespan=lifespan), startup_timeout_s=30):
            pass
    assert "the policy bundle is unreadable" in str(failure.value)
    assert "Traceback" in str(failure.value)
    assert not failure.value.address_in_use


def test_a_port_taken_during_start_up_is_reported_as_such():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()

    @asynccontextmanager
    async def lifespan(app):
        # What the operator listener does in the gateway's lifespan: listen on a configured port.
        second = socket.socket()
        try:
            second.bind(taken.getsockname())
        finally:
            second.close()
        yield

    try:
        with pytest.raises(ServerStartError) as failure:
            with serving(FastAPI(lifespan=lifespan), startup_timeout_s=30):
                pass
    finally:
        taken.close()
    assert failure.value.address_in_use


def test_serves_on_the_port_it_bound():
    app = FastAPI()

    @app.get("/ping")
    def ping() -> dict:
        return {"pong": True}

    with serving(app, startup_timeout_s=30) as base_url:
        assert httpx.get(base_url + "/ping", timeout=10).json() == {"pong": True}
