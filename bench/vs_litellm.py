"""tenantgate and LiteLLM's proxy side by side, both as gateways in front of the same fast mock
OpenAI upstream, driven by wrk (a C load generator, so the client is not what caps them).

Three servers, one process each, on loopback:
- mock: gateway_overhead.py's bare endpoint, an OpenAI-compatible upstream answering a fixed
  chat completion (or its event stream) in a fraction of a millisecond;
- tenantgate: `create_app` with a deployments file whose one deployment is the mock; every
  request carries an Entra-style RS256 token from a local issuer and passes the whole path
  (token, Rego decision, limits, audit record in the signed trail);
- litellm: `litellm --config` (`litellm[proxy]`, in a virtualenv of its own: bench/install_litellm.sh)
  with the mock as an `openai/` model and a master key, no database.

Rounds alternate the three; each prints its load average. Per round: latency at concurrency 1
(wrk --latency, one connection) and requests/s at concurrency 32. Printed: the medians over the
rounds, each gateway's added p50 against calling the mock directly, and tenantgate against LiteLLM.
Targets (issue 31): at concurrency 32 at least 5x LiteLLM's req/s, and under a tenth of its added
p50. Exit status 1 if a target is missed or a server could not start.

    bench/install_litellm.sh                     # once: .venv-litellm
    .venv/bin/python bench/vs_litellm.py         # 3 rounds of 10 s per server and concurrency
    .venv/bin/python bench/vs_litellm.py --seconds 5 --rounds 2 --stream
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gateway_overhead import AUDIENCE, TENANT, bench_data, load_average, start_server, stop_server
from devkit.issuer import LocalIssuer
from devkit.server import free_port

LITELLM = ROOT / ".venv-litellm" / "bin" / "litellm"
MASTER_KEY = "sk-bench-master-key"
TARGET_RPS_RATIO = 5.0  # tenantgate's req/s at concurrency 32 over LiteLLM's
TARGET_ADDED_RATIO = 0.1  # tenantgate's added p50 over LiteLLM's
MESSAGE = " ".join(["token"] * 40)


def mock_answers(directory: Path) -> tuple[Path, Path]:
    """The mock's answers: one chat completion of 16 tokens, and the same as an event stream."""
    created = int(time.time())
    body = {"id": "chatcmpl-mock", "object": "chat.completion", "created": created, "model": "demo",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": " ok" * 16},
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 16, "total_tokens": 66}}
    chunk = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": created, "model": "demo"}
    events = [{**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None}]}]
    events += [{**chunk, "choices": [{"index": 0, "delta": {"content": " ok"}, "finish_reason": None}]}] * 16
    events += [{**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                "usage": body["usage"]}]
    body_file, stream_file = directory / "body.json", directory / "stream.txt"
    body_file.write_text(json.dumps(body))
    stream_file.write_text("".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n")
    return body_file, stream_file


def start_litellm(directory: Path, mock_url: str) -> tuple[subprocess.Popen, str]:
    config = directory / "litellm.yaml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "model_list": [{"model_name": "demo", "litellm_params": {
            "model": "openai/demo", "api_base": mock_url + "/v1", "api_key": "sk-mock"}}],
        "general_settings": {"master_key": MASTER_KEY},
        "litellm_settings": {"telemetry": False, "drop_params": True},
    }))
    port = free_port()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
           "LITELLM_TELEMETRY": "False", "DISABLE_ADMIN_UI": "True", "NO_DOCS": "True"}
    log = (directory / "litellm.log").open("w")
    process = subprocess.Popen([str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                                "--num_workers", "1"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=directory)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"litellm exited: {(directory / 'litellm.log').read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health/liveliness", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    process.kill()
    raise RuntimeError("litellm did not start in 180 s")


def wrk_script(directory: Path, name: str, token: str, stream: bool) -> Path:
    body = {"model": "demo", "max_tokens": 16, "messages": [{"role": "user", "content": MESSAGE}]}
    if stream:
        body["stream"] = True
    script = directory / f"{name}.lua"
    script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(json.dumps(body))}\n'
                      f'wrk.headers["Content-Type"] = "application/json"\n'
                      f'wrk.headers["Authorization"] = "Bearer {token}"\n'
                      # A run whose answers are not 200 measures nothing: count them.
                      'function response(status, headers, body) if status ~= 200 then bad = bad + 1 end end\n'
                      + WRK_COUNT_BAD)
    return script


# wrk runs `response` in each thread's Lua state and `done` in another one, which sees no thread's
# globals: the count is read from the threads that `setup` kept.
WRK_COUNT_BAD = ('bad = 0\nthreads = {}\n'
                 'function setup(thread) table.insert(threads, thread) end\n'
                 'function done(summary, latency, requests)\n'
                 '  local total = 0\n'
                 '  for _, thread in ipairs(threads) do total = total + thread:get("bad") end\n'
                 '  io.write("non-200: " .. total .. "\\n")\n'
                 'end\n')


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(number) * _UNITS[unit]


def wrk(url: str, script: Path, connections: int, seconds: float,
        path: str = "/v1/chat/completions") -> dict[str, float]:
    """One wrk run against url + path (path "" for a url that is whole already): its req/s,
    requests and latency percentiles (ms)."""
    command = ["wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds:g}s", "--latency", "-s", str(script),
               url + path]
    out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    text = out.stdout
    bad = re.search(r"non-200: (\d+)", text)
    if (out.returncode != 0 or bad is None or int(bad.group(1)) or "Socket errors" in text
            or "Non-2xx or 3xx responses" in text):
        raise RuntimeError(f"wrk against {url} failed or got errors:\n{text}{out.stderr}")
    result = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),
              "requests": float(re.search(r"(\d+) requests in", text).group(1))}
    for q in ("50", "99"):
        result[f"p{q}"] = _ms(re.search(rf"\s{q}%\s+([\d.]+(?:us|ms|s))", text).group(1))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per server")
    parser.add_argument("--stream", action="store_true", help="streamed requests as well")
    args = parser.parse_args()
    if shutil.which("wrk") is None or not LITELLM.exists():
        print("vs_litellm: needs wrk (apt-get install wrk) and .venv-litellm (bench/install_litellm.sh)",
              file=sys.stderr)
        return 1
    os.environ.setdefault("TENANTGATE_CACHE_DIR", tempfile.mkdtemp(prefix="tenantgate-bench-"))
    with tempfile.TemporaryDirectory() as tmp, LocalIssuer(port=0) as issuer, ExitStack() as servers:
        directory = Path(tmp)
        body_file, stream_file = mock_answers(directory)
        mock_port = free_port()
        servers.callback(stop_server, start_server(["bare", "--body-file", str(body_file), "--stream-file",
                                                    str(stream_file)], mock_port))
        mock = f"http://127.0.0.1:{mock_port}"
        deployments = directory / "deployments.json"
        deployments.write_text(json.dumps({"models": {"demo": [{
            "name": "mock", "kind": "openai", "dialect": "openai", "url": mock + "/v1", "upstream_model": "demo",
            "dedicated_tenants": [TENANT]}]}}))
        port = free_port()
        servers.callback(stop_server, start_server(
            ["gateway", "--issuer-url", issuer.base_url, "--data-dir", str(bench_data(directory)),
             "--audit-file", str(directory / "audit.log"),
             "--settings", json.dumps({"deployments_file": str(deployments)})], port))
        litellm, litellm_url = start_litellm(directory, mock)
        servers.callback(stop_server, litellm)
        urls = {"tenantgate": f"http://127.0.0.1:{port}", "litellm": litellm_url, "mock": mock}
        token = issuer.mint(TENANT, audience=AUDIENCE, lifetime_s=6 * 3600)
        keys = {"tenantgate": token, "litellm": MASTER_KEY, "mock": "sk-mock"}
        print(f"vs_litellm: {args.rounds} alternating rounds of {args.seconds:g} s per server and concurrency, "
              f"wrk 1 thread; load {load_average()}")
        ok = True
        for stream in ([False, True] if args.stream else [False]):
            ok &= compare(urls, keys, directory, args, stream)
    return 0 if ok else 1


def compare(urls: dict[str, str], keys: dict[str, str], directory: Path, args: argparse.Namespace,
            stream: bool) -> bool:
    kind = "streamed" if stream else "not streamed"
    scripts = {name: wrk_script(directory, f"{name}-{int(stream)}", key, stream) for name, key in keys.items()}
    for name in urls:  # warm up, and check each answers 200
        wrk(urls[name], scripts[name], 1, 1)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in urls}
    print(f"\n{kind}:")
    for round_ in range(args.rounds):
        for name, url in urls.items():
            c1, c32 = wrk(url, scripts[name], 1, args.seconds), wrk(url, scripts[name], 32, args.seconds)
            runs[name].append({"p50": c1["p50"], "p99": c1["p99"], "rps": c32["rps"]})
            print(f"  round {round_ + 1} {name:<10} c1 p50 {c1['p50']:7.2f} ms  p99 {c1['p99']:7.2f} ms  "
                  f"c32 {c32['rps']:7.0f} req/s  load {load_average()}", flush=True)
    median = {name: {k: statistics.median(r[k] for r in rs) for k in ("p50", "p99", "rps")}
              for name, rs in runs.items()}
    added = {name: median[name]["p50"] - median["mock"]["p50"] for name in ("tenantgate", "litellm")}
    for name in ("tenantgate", "litellm", "mock"):
        extra = f"  added p50 {added[name]:6.2f} ms" if name in added else ""
        print(f"  median {name:<10} c1 p50 {median[name]['p50']:7.2f} ms  p99 {median[name]['p99']:7.2f} ms  "
              f"c32 {median[name]['rps']:7.0f} req/s{extra}")
    rps_ratio = median["tenantgate"]["rps"] / median["litellm"]["rps"]
    added_ratio = added["tenantgate"] / added["litellm"] if added["litellm"] > 0 else float("inf")
    rps_met, added_met = rps_ratio >= TARGET_RPS_RATIO, added_ratio < TARGET_ADDED_RATIO
    print(f"  tenantgate / litellm: c32 req/s {rps_ratio:.2f}x (target >= {TARGET_RPS_RATIO:g}x: "
          f"{'met' if rps_met else 'MISSED'}), added p50 {added_ratio:.3f}x (target < {TARGET_ADDED_RATIO:g}x: "
          f"{'met' if added_met else 'MISSED'})")
    return rps_met and added_met


if __name__ == "__main__":
    raise SystemExit(main())
