"""Crashes and restarts of a real writer process (the trail `tenantgate serve` builds, see
writer.py), with its anchors in a real redis-server, checked with `tenantgate audit verify`.

The trail: boot 1 of pod gw-0 (PID 1, as in a container) writes 10 records (checkpoints
at seq 5 and 11), waits for its timer to anchor seq 12, writes records 12-14 and is
SIGKILLed. Boot 2 of the same pod writes 6 records (a checkpoint at 5) and shuts down
(its closing checkpoint at 7, the closing anchor at 8).
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis

from devkit.redis import RedisServer
from devkit.server import gateway_env
from gateway.main import main
from tests.gateway.audit.chains import cut_mid_line, edit_and_relink, forge, index_of

REPO = Path(__file__).resolve().parents[3]


class Writer:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        with log.open("ab") as stderr:
            self.process = subprocess.Popen([sys.executable, "-m", "tests.gateway.audit.writer"], cwd=REPO, env=env,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
        self.log = log
        self.chain = self.answer(60).removeprefix("chain ")

    def answer(self, timeout_s: float = 30) -> str:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline() if ready else ""
        assert line, f"the writer did not answer:\n{self.log.read_text()[-2000:]}"
        return line.strip()

    def ask(self, command: str) -> str:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.answer()

    def close(self) -> None:
        self.process.stdin.close()
        assert self.answer() == "closed"
        assert self.process.wait(30) == 0
        self.process.stdout.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)
        self.process.stdin.close()
        self.process.stdout.close()


def keygen(directory: Path) -> tuple[Path, Path]:
    assert main(["audit", "keygen", "--out", str(directory)]) == 0
    return directory / "audit-signing.pem", directory / "audit-signing.pub.pem"


def writer_env(tmp: Path, key: Path, **settings: str) -> dict[str, str]:
    return gateway_env(TENANTGATE_AUDIT_FILE=str(tmp / "audit.jsonl"), TENANTGATE_AUDIT_SIGNING_KEY=str(key),
                       TENANTGATE_AUDIT_STDOUT="false", AUDIT_WRITER_AS_POD="gw-0", **settings)


def wait_for_seq(client: redis.Redis, stream: str, chain: str, seq: int, timeout_s: float = 15) -> None:
    """Until the stream holds the entry (an anchor, or a record) of `chain` at `seq`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [json.loads(fields[b"entry"]) for _, fields in client.xrange(stream)]
        if any(a["chain"] == chain and a["seq"] == seq for a in found):
            return
        time.sleep(0.02)
    raise AssertionError(f"no entry for seq {seq} of chain {chain} in {stream}")


@pytest.fixture(scope="module")
def trail(redis_binary, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("restarts")
    server = RedisServer(redis_binary, tmp).start()
    key, public = keygen(tmp / "keys")
    env = writer_env(tmp, key, TENANTGATE_REDIS_URL=server.url, TENANTGATE_AUDIT_REDIS_STREAM="gw:audit",
                     TENANTGATE_AUDIT_ANCHOR_STREAM="gw:anchors", TENANTGATE_AUDIT_CHECKPOINT_EVERY="5",
                     TENANTGATE_AUDIT_CHECKPOINT_INTERVAL_S="2")
    client = redis.Redis.from_url(server.url)
    try:
        first = Writer(env, tmp / "writer.log")
        assert first.ask("write 10") == "seq 12"
        wait_for_seq(client, "gw:anchors", first.chain, 12)
        assert first.ask("write 3") == "seq 15"
        # The stream sink writes from a queue; what is still queued at a SIGKILL is lost by design,
        # so the crash comes once the central copy has the tail (the file's tail stays unsigned).
        wait_for_seq(client, "gw:audit", first.chain, 14)
        first.kill()
        killed_at = time.time()
        second = Writer(env, tmp / "writer.log")
        assert second.ask("write 6") == "seq 7"
        second.close()
        time.sleep(max(0.0, killed_at + 1 - time.time()))  # the killed writer is older than strict(trail) allows
        yield SimpleNamespace(file=tmp / "audit.jsonl", public=str(public), url=server.url, first=first.chain,
                              second=second.chain, tmp=tmp)
    finally:
        client.close()
        server.stop()


def verify(capsys, *args: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["audit", "verify", *args])
    return code, capsys.readouterr().out.splitlines()


def strict(trail, max_age: float = 0.5) -> list[str]:
    return ["--strict", "--max-unsigned-age", str(max_age), "--anchors", trail.url, "--anchor-stream", "gw:anchors"]


def test_a_restarted_container_starts_a_chain_of_its_own(trail, capsys):
    assert trail.first != trail.second
    assert trail.first.startswith("gw-0-1-") and trail.second.startswith("gw-0-1-")
    code, out = verify(capsys, str(trail.file), "--public-key", trail.public)
    assert code == 0, out
    assert out[:2] == ["ok with warnings: 19 records, 4 checkpoints, 2 chains",
                       "warning: no checkpoint covers records after seq 11"]


def test_strict_names_the_killed_writers_unsigned_tail(trail, capsys):
    code, out = verify(capsys, str(trail.file), "--public-key", trail.public, *strict(trail))
    assert code == 3, out
    assert out[0].startswith("UNVERIFIED: 19 records, 4 checkpoints, 2 chains, ")
    assert out[1].startswith("first problem: records 12-14 are signed by no checkpoint or anchor, and the chain's "
                             "last anchor is ") and out[1].endswith(f"(chain {trail.first})")
    assert "its writer stopped" in out[1]
    # Within the age a live writer may still sign it: then strict only warns.
    code, out = verify(capsys, str(trail.file), "--public-key", trail.public, *strict(trail, max_age=3600))
    assert code == 0 and out[1] == "warning: no checkpoint or anchor covers records after seq 11", out


def test_the_central_copy_verifies_against_the_anchors_too(trail, capsys):
    code, out = verify(capsys, "--redis", trail.url, "--stream", "gw:audit", "--public-key", trail.public,
                       *strict(trail, max_age=3600))
    assert code == 0 and out[0].startswith("ok with warnings: 19 records"), out


def _chain_end(lines: list[str], chain: str) -> str:
    return [line for line in lines if json.loads(line)["chain"] == chain][-1]


TAMPERING = {
    # name: (edit of the file's lines, exit code, the verdict's first problem); strict with a
    # max age of 0.5 s, so that the killed writer's tail is named too (first, or in a warning)
    "records appended after the shutdown": (
        lambda lines, t: lines + forge(2, after=_chain_end(lines, t.second)),
        1, "record 8 follows the chain's closing checkpoint (written after its writer shut down)"),
    "the closing checkpoint deleted": (
        lambda lines, t: [line for line in lines if line != _chain_end(lines, t.second)],
        1, "the closing checkpoint at seq 7 is missing (deleted): an anchor vouches for the chain through seq 7"),
    "forged records in place of the closing checkpoint": (
        lambda lines, t: (rest := [line for line in lines if line != _chain_end(lines, t.second)])
        + forge(3, after=_chain_end(rest, t.second)),
        1, "entries 6-7 differ from the anchor for seq 8 (altered or replaced)"),
    "records appended to the killed writer's chain": (
        lambda lines, t: lines + forge(2, after=_chain_end(lines, t.first)),
        3, "records 12-16 are signed by no checkpoint or anchor"),
    "the killed writer's unsigned tail edited": (
        lambda lines, t: edit_and_relink(lines, 13, t.first, outcome="error"),
        3, "records 12-14 are signed by no checkpoint or anchor"),
    "a whole chain injected": (
        lambda lines, t: lines + forge(5, chain_id="gw-0-1-0badc0de"),
        3, "records 12-14 are signed by no checkpoint or anchor"),
    "a signed record edited": (
        lambda lines, t: edit_and_relink(lines, 2, t.second, outcome="error"),
        1, "record 4 was altered"),
}


@pytest.mark.parametrize("case", TAMPERING)
def test_each_forgery_gets_a_verdict_that_says_what_happened(trail, capsys, case):
    tamper, expected_code, expected = TAMPERING[case]
    lines = trail.file.read_text().splitlines()
    forged = trail.tmp / f"forged-{index_of(lines, 0)}.jsonl"
    forged.write_text("".join(line + "\n" for line in tamper(lines, trail)))
    code, out = verify(capsys, str(forged), "--public-key", trail.public, *strict(trail))
    assert code == expected_code, out
    assert out[0].startswith("TAMPERED" if code == 1 else "UNVERIFIED")
    assert out[1].startswith(f"first problem: {expected}"), out
    if case == "a whole chain injected":
        assert "warning: chain gw-0-1-0badc0de has no anchor" in out


def test_a_torn_last_line_is_reported_and_repaired_by_the_next_boot(tmp_path, capsys):
    key, public = keygen(tmp_path / "keys")
    env = writer_env(tmp_path, key, TENANTGATE_AUDIT_CHECKPOINT_INTERVAL_S="300")
    audit = tmp_path / "audit.jsonl"
    first = Writer(env, tmp_path / "writer.log")
    assert first.ask("write 8") == "seq 8"
    first.kill()
    torn = cut_mid_line(audit)  # the power failed while record 7 was being written
    code, out = verify(capsys, str(audit), "--public-key", str(public))
    assert code == 0, out
    assert f"warning: {audit}:8 is a torn last entry (40 bytes without a newline: its writer stopped mid-write)" in out

    second = Writer(env, tmp_path / "writer.log")
    assert second.ask("write 2") == "seq 3"  # the repair record, then two records
    second.close()
    assert audit.read_bytes().split(b"\n")[7] == torn
    code, out = verify(capsys, str(audit), "--public-key", str(public))
    assert code == 0 and out[0] == "ok with warnings: 10 records, 1 checkpoints, 2 chains", out
    assert (f"warning: {audit}:8 is a torn entry (40 bytes; its writer stopped mid-write): chain {second.chain} "
            "ended the line when it started") in out
    # The crash left the first boot's records unsigned, and strict says so.
    code, out = verify(capsys, str(audit), "--public-key", str(public), "--strict")
    assert code == 3 and out[1] == f"first problem: the chain has no checkpoint: nothing in it is signed " \
                                   f"(injected, or its writer crashed before signing) (chain {first.chain})", out


def test_a_full_disk_holds_anchors_back_so_a_crash_then_is_no_tampering(redis_server, tmp_path, capsys):
    key, public = keygen(tmp_path / "keys")
    audit = tmp_path / "audit.jsonl"
    env = writer_env(tmp_path, key, TENANTGATE_REDIS_URL=redis_server.url, TENANTGATE_AUDIT_REDIS_STREAM="gw:audit",
                     TENANTGATE_AUDIT_ANCHOR_STREAM="gw:anchors", TENANTGATE_AUDIT_CHECKPOINT_EVERY="3",
                     TENANTGATE_AUDIT_CHECKPOINT_INTERVAL_S="0.5")
    client = redis_server.client()
    writer = Writer(env, tmp_path / "writer.log")
    assert writer.ask("write 3") == "seq 4"  # records 0-2, checkpoint 3
    wait_for_seq(client, "gw:anchors", writer.chain, 4)
    assert writer.ask(f"limit-file-size {audit.stat().st_size + 100}") == "limited"  # the disk fills up
    assert writer.ask("write 2") == "seq 6"
    time.sleep(2)  # the timer signs records 4-5 (into the file's buffer) and tries to anchor, four times
    writer.kill()
    anchored = [json.loads(fields[b"entry"])["seq"] for _, fields in client.xrange("gw:anchors")]
    client.close()
    assert max(anchored) == 4, "an anchor vouched for entries the full disk never took"
    assert "failed to flush" in (tmp_path / "writer.log").read_text()
    args = [str(audit), "--public-key", str(public), "--anchors", redis_server.url, "--anchor-stream", "gw:anchors",
            "--strict"]
    code, out = verify(capsys, *args)
    assert code == 0 and out[1] == f"warning: {audit}:5 is a torn last entry (100 bytes without a newline: its " \
                                   "writer stopped mid-write)", out
    # The central copy has all of it, signed by the checkpoint the file could not take.
    code, out = verify(capsys, "--redis", redis_server.url, "--stream", "gw:audit", *args[1:])
    assert code == 0 and out[0].startswith("ok: 5 records, 2 checkpoints, 1 chain"), out
