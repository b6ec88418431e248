"""A full audit disk, for real: `tenantgate serve` writes its trail to a 1 MiB tmpfs, callers
(the openai SDK, over HTTP) keep sending while the records fill it, then the disk is freed.
No request is acknowledged without its record: while the file sink cannot write, new requests
get 503 audit_unavailable, the records of those already running wait in memory (bounded; past
the bound their requests get 503 too), and once there is room they are written in order and
the trail verifies, strictly, against its anchors."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from devkit.server import free_port, tenantgate_serve
from gateway.audit import load_or_create_signing_key, public_key_pem
from gateway.errors import AuditUnavailable
from gateway.main import main
from tests.gateway.api.conftest import ALPHA, AUDIENCE, serve_env
from tests.utils.disk import fill, tiny_filesystem

CHAT = [{"role": "user", "content": "Is this request in the audit trail?"}]
CALLERS, REQUESTS = 8, 480


def metric(url: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", httpx.get(url, timeout=5).text, re.MULTILINE)
    return float(found[1]) if found else float("nan")


def wait_for(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def call(client: openai.OpenAI, i: int) -> tuple[str, str]:
    """("ok", the completion's id) or ("refused", the error code); a stream counts as acknowledged at [DONE]."""
    try:
        if i % 4 == 0:
            ids = {chunk.id for chunk in client.chat.completions.create(model="demo", messages=CHAT, max_tokens=2,
                                                                         stream=True)}
            return "ok", ids.pop()
        return "ok", client.chat.completions.create(model="demo", messages=CHAT, max_tokens=2).id
    except openai.APIStatusError as exc:
        return "refused", f"{exc.status_code} {exc.code}"
    except openai.APIError as exc:  # an error event ending a stream
        return "refused", f"stream {getattr(exc, 'code', None)}"


def test_a_full_audit_disk_refuses_requests_and_loses_no_acknowledged_record(local_issuer, tmp_path: Path,
                                                                              capsys) -> None:
    metrics_port = free_port()
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    with tiny_filesystem(tmp_path / "disk", 1 << 20) as disk:
        audit, anchors, key = disk / "audit.jsonl", tmp_path / "anchors.jsonl", tmp_path / "audit-signing.pem"
        env = serve_env(local_issuer, TENANTGATE_AUDIT_FILE=str(audit), TENANTGATE_AUDIT_SIGNING_KEY=str(key),
                        TENANTGATE_AUDIT_ANCHOR_FILE=str(anchors), TENANTGATE_METRICS_PORT=str(metrics_port),
                        TENANTGATE_AUDIT_CHECKPOINT_INTERVAL_S="1", TENANTGATE_AUDIT_FILE_HOLD_BYTES="1500")
        with tenantgate_serve(tmp_path, env) as server:
            fill(disk / "filler", leave_bytes=160 << 10)  # room for about a hundred records
            client = openai.OpenAI(base_url=server.base_url + "/v1",
                                   api_key=local_issuer.mint(ALPHA, audience=AUDIENCE), max_retries=0, timeout=30)
            with ThreadPoolExecutor(CALLERS) as pool:
                answers = list(pool.map(lambda i: call(client, i), range(REQUESTS)))
            stalled = {name: metric(metrics, name) for name in
                       ("tenantgate_audit_accepting", "tenantgate_audit_held_entries",
                        "tenantgate_audit_unavailable_total", "tenantgate_audit_records_refused")}
            ready_while_full = httpx.get(server.base_url + "/readyz", timeout=5).status_code

            (disk / "filler").unlink()  # the operator frees the disk
            assert wait_for(lambda: metric(metrics, "tenantgate_audit_accepting") == 1.0), "the trail never recovered"
            after = [call(client, i) for i in range(1, 9)]
            client.close()
        log = server.stderr.read_text()

        acknowledged = [value for outcome, value in answers + after if outcome == "ok"]
        refusals = {value for outcome, value in answers if outcome == "refused"}
        records = [json.loads(line) for line in audit.read_text().splitlines()]
        recorded = {r["request_id"] for r in records if r["type"] == "record" and "request_id" in r}
        missing = [i for i in acknowledged if i not in recorded]
        assert not missing, f"{len(missing)} of {len(acknowledged)} acknowledged requests have no record"
        assert all(outcome == "ok" for outcome, _ in after)
        assert refusals and refusals <= {"503 audit_unavailable", "stream audit_unavailable"}, refusals
        assert len(acknowledged) < REQUESTS  # the disk did fill: some were refused
        assert stalled["tenantgate_audit_accepting"] == 0 and stalled["tenantgate_audit_held_entries"] > 0, stalled
        assert stalled["tenantgate_audit_unavailable_total"] > 0, stalled
        assert ready_while_full == 503  # out of the Service while it can serve no one
        assert "refused a write (ENOSPC)" in log and "takes writes again" in log
        assert CHAT[0]["content"] not in log

        public = tmp_path / "audit-signing.pub.pem"  # the public half of the key the gateway created
        public.write_bytes(public_key_pem(load_or_create_signing_key(key)))
        capsys.readouterr()
        code = main(["audit", "verify", str(audit), "--public-key", str(public), "--strict", "--anchors", str(anchors)])
        out = capsys.readouterr().out
        assert code == 0 and out.startswith("ok"), out
        refused_count = REQUESTS - len(answers) + sum(o != 'ok' for o, _ in answers)
        print(f"acknowledged {len(acknowledged)}, refused {refused_count}, at the stall: {stalled}")


def test_a_stream_whose_record_cannot_be_kept_ends_in_an_error_not_done(local_issuer, demo_model_dir,
                                                                         tmp_path: Path) -> None:
    # Two streams run when the disk fills. The first to end has its record held (the bound lets
    # one wait) and gets [DONE]; the second's record cannot be kept, so its stream ends in an
    # audit_unavailable error instead of [DONE], and its record takes no seq.
    with tiny_filesystem(tmp_path / "disk", 1 << 20) as disk:
        audit, key = disk / "audit.jsonl", tmp_path / "audit-signing.pem"
        env = serve_env(local_issuer, TENANTGATE_ENGINE="embedded", TENANTGATE_MODEL="demo",
                        TENANTGATE_KV_CACHE_MEMORY_BYTES=str(32 << 20), TENANTGATE_AUDIT_FILE=str(audit),
                        TENANTGATE_AUDIT_SIGNING_KEY=str(key), TENANTGATE_AUDIT_FILE_HOLD_BYTES="1")
        with tenantgate_serve(tmp_path, env) as server:
            client = openai.OpenAI(base_url=server.base_url + "/v1",
                                   api_key=local_issuer.mint(ALPHA, audience=AUDIENCE), max_retries=0, timeout=60)
            first, second = (client.chat.completions.create(model="demo", messages=CHAT, max_tokens=64, stream=True)
                             for _ in range(2))
            ids = [next(iter(first)).id, next(iter(second)).id]  # both admitted and running
            fill(disk / "filler")
            list(first)  # to [DONE]
            try:
                list(second)
                ended = "done"
            except openai.APIError as exc:
                ended = exc.message
            with pytest.raises(openai.APIStatusError) as refused:  # and nothing new starts
                client.chat.completions.create(model="demo", messages=CHAT, max_tokens=2)
            (disk / "filler").unlink()
            assert wait_for(lambda: httpx.get(server.base_url + "/readyz", timeout=5).status_code == 200)
            client.close()
        assert ended == AuditUnavailable.MESSAGE
        assert (refused.value.status_code, refused.value.code) == (503, "audit_unavailable")
        assert refused.value.response.headers["retry-after"] == "5"
        recorded = [json.loads(line) for line in audit.read_text().splitlines()]
        recorded_ids = {r.get("request_id") for r in recorded}
        assert ids[0] in recorded_ids and ids[1] not in recorded_ids
        assert [r["seq"] for r in recorded] == list(range(len(recorded)))  # no seq given to the refused record
