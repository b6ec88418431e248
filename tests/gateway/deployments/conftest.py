"""llama.cpp's llama-server on SmolLM2, for the tests of the `upstream` marker."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devkit.server import free_port, stop


def llama_server_binary() -> Path:
    named = os.environ.get("TENANTGATE_LLAMA_SERVER")
    if named:
        if not Path(named).is_file():
            pytest.fail(f"TENANTGATE_LLAMA_SERVER={named} is not a file")
        return Path(named)
    # The build script's cache (the test session points TENANTGATE_CACHE_DIR elsewhere).
    cached = sorted(Path.home().glob(".cache/tenantgate/llama.cpp/*/bin/llama-server"))
    if not cached:
        pytest.skip("llama-server not built: run `make test-upstream` (bench/build_llamacpp.sh, ~10 min)")
    return cached[-1]


@pytest.fixture(scope="module")
def llama_server(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-server on 127.0.0.1 with one slot, so a repeated prompt meets its own KV."""
    yield from _serve_llama(smollm2_gguf, tmp_path_factory, threads=2)


@pytest.fixture(scope="module")
def llama_server_one_thread(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same on one thread, for timing tests: on a loaded machine, ggml's threads wait for each
    other at every graph node, so a 4-token prompt can take as long as a 50-token one; one thread
    keeps a request's time proportional to its work."""
    yield from _serve_llama(smollm2_gguf, tmp_path_factory, threads=1)


def _serve_llama(gguf: Path, tmp_path_factory: pytest.TempPathFactory, *, threads: int) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "llama-server.log"
    # LLAMA_ARG_REPACK=0: no repacked (AMX) weight buffers. The pinned build (11434, -march=native)
    # segfaults in ggml_backend_amx_mul_mat at its warm-up on an AMX Xeon; these tests are about the
    # server's API, slots and cache, which its plain CPU path serves alike (a build without the
    # setting ignores the variable).
    env = dict(os.environ, LLAMA_ARG_REPACK="0")
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(llama_server_binary()), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
             "-t", str(threads), "-np", "1", "-c", "2048", "--no-webui"], stdout=out, stderr=subprocess.STDOUT,
            env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama-server exited {process.returncode}:\n{log.read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama-server not ready after 120 s:\n{log.read_text()[-2000:]}")
            time.sleep(0.25)
        yield url + "/v1"
    finally:
        stop(process, 10)
