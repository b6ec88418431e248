"""`tenantgate serve --workers N` over real sockets: N processes behind one port, each answering
with an audit chain of its own that `audit verify` checks as one trail; a killed worker is
restarted, SIGTERM stops them all, workers that keep dying stop the supervisor with an error,
and the configurations whose state cannot be shared are refused before anything starts."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from devkit.server import TENANTGATE, ServeProcess, gateway_env, tenantgate_serve
from tests.gateway.api.conftest import AUDIENCE, BETA, serve_env
from tests.gateway.deployments.test_openai_upstream import FakeUpstream

MODEL = "some-other-model"  # the one model Beta's policy names
STARTED = re.compile(r"worker (\d+) started \(pid (\d+)\)")


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    from devkit.server import serving

    fake = FakeUpstream()
    with serving(fake.app) as url:
        yield url


@pytest.fixture
def workers_env(local_issuer, redis_server, upstream: str, tmp_path: Path) -> dict[str, str]:
    deployments = tmp_path / "deployments.json"
    deployments.write_text(json.dumps({"models": {MODEL: [
        {"name": "vllm-a", "kind": "openai", "dialect": "vllm", "url": upstream + "/v1"}]}}))
    keys = tmp_path / "keys"
    subprocess.run([TENANTGATE, "audit", "keygen", "--out", str(keys)], check=True, capture_output=True,
                   env=gateway_env())
    return serve_env(local_issuer, TENANTGATE_DEPLOYMENTS_FILE=str(deployments), TENANTGATE_REDIS_URL=redis_server.url,
                     TENANTGATE_AUDIT_FILE=str(tmp_path / "audit.jsonl"),
                     TENANTGATE_AUDIT_ANCHOR_FILE=str(tmp_path / "anchors.jsonl"),
                     TENANTGATE_AUDIT_SIGNING_KEY=str(keys / "audit-signing.pem"),
                     TENANTGATE_AUDIT_CHECKPOINT_INTERVAL_S="1", TENANTGATE_SHUTDOWN_TIMEOUT_S="5")


def chat(base_url: str, token: str) -> int:
    """One request on a connection of its own, so the kernel hands each to whichever worker accepts first."""
    response = httpx.post(base_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {token}"},
                          json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
                          timeout=30)
    return response.status_code


def records_by_chain(tmp_path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in sorted(tmp_path.glob("audit.jsonl*")):
        for line in path.read_text().split("\n")[:-1]:  # a line still being written has no newline yet
            entry = json.loads(line)
            if entry["type"] == "record":
                counts[f"{path.name}:{entry['chain']}"] = counts.get(f"{path.name}:{entry['chain']}", 0) + 1
    return counts


def worker_pids(server: ServeProcess) -> dict[int, int]:
    """The newest pid of each worker, as the supervisor logged it."""
    return {int(index): int(pid) for index, pid in STARTED.findall(server.stderr.read_text())}


def wait_for(condition, timeout_s: float = 60.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def two_free_ports() -> int:
    """A port that is free, and the one after it (worker 1's operator port)."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            try:
                second.bind(("127.0.0.1", first.getsockname()[1] + 1))
            except OSError:
                continue
            return first.getsockname()[1]
    raise AssertionError("no two adjacent free ports")


def test_two_workers_answer_on_one_port_each_with_its_own_chain_and_the_trail_verifies(
        local_issuer, workers_env: dict[str, str], tmp_path: Path) -> None:
    token = local_issuer.mint(BETA, audience=AUDIENCE)
    metrics_port = two_free_ports()
    env = workers_env | {"TENANTGATE_METRICS_PORT": str(metrics_port)}
    with tenantgate_serve(tmp_path, env, "--workers", "2") as server:
        assert sorted(worker_pids(server)) == [0, 1]
        with ThreadPoolExecutor(8) as pool:
            # Both workers accept from the one socket: each soon has requests of its own.
            def both_answered() -> bool:
                assert set(pool.map(lambda _: chat(server.base_url, token), range(32))) == {200}
                return {name.split(":")[0] for name in records_by_chain(tmp_path)} == {
                    "audit.jsonl.worker-0", "audit.jsonl.worker-1"}
            wait_for(both_answered, what="both workers to answer")
        # Each worker's operator listener is its own, on the port after the one before.
        for port in (metrics_port, metrics_port + 1):
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
            assert metrics.status_code == 200 and "tenantgate_requests_total" in metrics.text
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0
    chains = records_by_chain(tmp_path)
    assert len({name.split(":")[1] for name in chains}) == 2  # one chain per worker, never one forked
    assert not (tmp_path / "audit.jsonl").exists()  # no worker appends to the shared name
    verified = subprocess.run([TENANTGATE, "audit", "verify", "--rotated", str(tmp_path / "audit.jsonl"),
                               "--public-key", str(tmp_path / "keys" / "audit-signing.pub.pem"), "--strict",
                               "--anchors", str(tmp_path / "anchors.jsonl")],
                              capture_output=True, text=True, env=gateway_env(), timeout=60)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"ok: {sum(chains.values())} records" in verified.stdout and "2 chains" in verified.stdout


def test_a_killed_worker_is_restarted_and_sigterm_stops_every_worker(
        local_issuer, workers_env: dict[str, str], tmp_path: Path) -> None:
    token = local_issuer.mint(BETA, audience=AUDIENCE)
    with tenantgate_serve(tmp_path, workers_env, "--workers", "2") as server:
        first = worker_pids(server)
        os.kill(first[0], signal.SIGKILL)
        restarted = wait_for(lambda: (pids := worker_pids(server))[0] != first[0] and pids, what="a restart")
        assert restarted[1] == first[1]  # the other worker served on
        assert f"worker 0 (pid {first[0]}) exited with signal SIGKILL" in server.stderr.read_text()
        before = set(records_by_chain(tmp_path))

        def restarted_worker_answers() -> bool:
            assert chat(server.base_url, token) == 200
            return any(name.startswith("audit.jsonl.worker-0:") for name in set(records_by_chain(tmp_path)) - before)
        wait_for(restarted_worker_answers, what="the restarted worker to answer")
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):  # no new connections once shutting down, as with one process
            httpx.get(server.base_url + "/healthz", timeout=2)
        assert server.process.wait(30) == 0
    for pid in restarted.values():
        assert not _alive(pid)


def test_workers_that_keep_dying_stop_the_supervisor_with_an_error(
        workers_env: dict[str, str], tmp_path: Path) -> None:
    with socket.socket() as taken:  # worker 0's operator port is taken: it can never start
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = workers_env | {"TENANTGATE_METRICS_PORT": str(taken.getsockname()[1])}
        result = subprocess.run([TENANTGATE, "serve", "--workers", "2", "--port", "0"], env=env,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "workers keep dying" in result.stderr
    assert len(STARTED.findall(result.stderr)) >= 6  # restarted, with backoff, before giving up


def test_workers_stop_themselves_when_their_supervisor_is_killed(
        workers_env: dict[str, str], tmp_path: Path) -> None:
    with tenantgate_serve(tmp_path, workers_env, "--workers", "2") as server:
        pids = worker_pids(server)
        server.process.kill()  # SIGKILL: no chance to stop them
        server.process.wait(10)
        try:
            wait_for(lambda: not any(_alive(pid) for pid in pids.values()), timeout_s=30,
                     what="the orphaned workers to stop")
        finally:  # a failure must not leave them serving
            for pid in pids.values():
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(("case", "message"), [
    ("no deployments file", "workers > 1 needs a deployments file"),
    ("no redis", "workers > 1 needs TENANTGATE_REDIS_URL"),
    ("dev", "workers > 1 is refused with the development issuer"),
    ("embedded deployment", "refused with an embedded deployment"),
])
def test_state_that_cannot_be_shared_refuses_more_than_one_worker(
        workers_env: dict[str, str], tmp_path: Path, case: str, message: str) -> None:
    env, args = dict(workers_env), ["serve", "--workers", "2"]
    if case == "no deployments file":
        del env["TENANTGATE_DEPLOYMENTS_FILE"]
    elif case == "no redis":
        del env["TENANTGATE_REDIS_URL"]
    elif case == "dev":
        args.append("--dev")
    else:
        (tmp_path / "deployments.json").write_text(json.dumps({"models": {"demo": [
            {"name": "local", "kind": "embedded"}]}}))
    result = subprocess.run([TENANTGATE, *args], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert "started" not in result.stderr  # refused before any worker ran


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"


