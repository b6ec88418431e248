"""The audit's gauges: what they say for each verdict, and the two ways out of a run that ends, a
textfile and a Pushgateway (a local HTTP server that keeps what was PUT, as a Pushgateway does)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.server import free_port
from gateway.cache import AuditResult, Comparison, Verdict
from gateway.cache.metrics import audit_registry, push, write_textfile

HIT = Comparison(1.0, 1e-9, 20, 20, 0.01, 0.05)
LIKE_A_MISS = Comparison(0.15, 0.98, 20, 20, 0.05, 0.05)


def _result(verdict: Verdict, cross: Comparison) -> AuditResult:
    return AuditResult(verdict, 0.01, cross, HIT, 20, 84, 12.5, "trials")


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.parametrize(("verdict", "cross", "leak", "inconclusive"), [
    (Verdict.LEAK, HIT, 1, 0), (Verdict.NO_LEAK, LIKE_A_MISS, 0, 0), (Verdict.INCONCLUSIVE, LIKE_A_MISS, 0, 1)])
def test_the_gauges_say_the_verdict_and_the_numbers(tmp_path: Path, verdict, cross, leak, inconclusive) -> None:
    path = tmp_path / "cache_audit.prom"
    write_textfile(path, audit_registry("vllm-a", _result(verdict, cross), now=1_800_000_000))
    samples = _samples(path.read_text())
    deployment = (("deployment", "vllm-a"),)
    assert samples[("tenantgate_cache_audit_leak", deployment)] == leak
    assert samples[("tenantgate_cache_audit_inconclusive", deployment)] == inconclusive
    assert samples[("tenantgate_cache_audit_alpha", deployment)] == 0.01
    assert samples[("tenantgate_cache_audit_last_run_timestamp_seconds", deployment)] == 1_800_000_000
    cross_labels = (("deployment", "vllm-a"), ("probe", "cross"))
    control_labels = (("deployment", "vllm-a"), ("probe", "control"))
    assert samples[("tenantgate_cache_audit_p_value", cross_labels)] == cross.p_value
    assert samples[("tenantgate_cache_audit_p_value", control_labels)] == HIT.p_value
    assert samples[("tenantgate_cache_audit_ks_statistic", cross_labels)] == cross.statistic
    assert samples[("tenantgate_cache_audit_samples", control_labels)] == 20
    assert not list(tmp_path.glob("*.tmp*")), "the textfile is renamed into place"


@pytest.fixture
def pushgateway() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    received: list[tuple[str, str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            received.append((self.command, self.path, self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


def test_push_replaces_the_deployments_group_on_the_pushgateway(pushgateway) -> None:
    url, received = pushgateway
    push(url, "llamacpp", audit_registry("llamacpp", _result(Verdict.LEAK, HIT)))
    [(method, path, body)] = received
    # PUT: the group (job and deployment) is replaced, so a deployment's last result is what stays.
    assert (method, path) == ("PUT", "/metrics/job/tenantgate-cache-audit/deployment/llamacpp")
    assert 'tenantgate_cache_audit_leak{deployment="llamacpp"} 1.0' in body.decode()


def test_an_unreachable_pushgateway_is_an_os_error() -> None:
    # The CLI reports an OSError as exit 2 (the verdict was printed; the export failed).
    with pytest.raises(OSError):
        push(f"http://127.0.0.1:{free_port()}", "x", audit_registry("x", _result(Verdict.LEAK, HIT)))
