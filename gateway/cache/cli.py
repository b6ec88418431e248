"""`tenantgate cache audit`: does a deployment's prefix cache cross namespaces? (docs/cache-audit.md)

    tenantgate cache audit embedded [--model demo] [--scope tenant|shared]
    tenantgate cache audit replica --url http://engine:8100 --envelope-signing-key KEY.pem
    tenantgate cache audit upstream --url http://vllm:8000/v1 --model NAME --namespace-field cache_salt
    tenantgate cache audit upstream --url http://llama:8080/v1 --model NAME            (no namespaces)
    tenantgate cache audit gateway --url https://gw/v1 --model NAME --token-a-file A --token-b-file B

Bounded by --trials, --max-requests, --max-seconds and --concurrency (1: sequential). Prints the
verdict with the KS statistics, p-values, sample sizes and median times (--json: one JSON object);
never a prompt, a token or a key. --textfile and --pushgateway export the result as Prometheus
gauges (tenantgate_cache_audit_*), which the shipped TenantgateCacheLeak alert reads.

Exit codes: 0 no leak found, 1 the cache crosses namespaces (leak), 2 unusable arguments, a
deployment that failed a probe, or gauges that could not be written (the verdict is printed
first), 3 inconclusive (the positive control was not significant).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from gateway.cache.segment import add_parser as add_segment_parser

EXIT_NO_LEAK, EXIT_LEAK, EXIT_USAGE, EXIT_INCONCLUSIVE = 0, 1, 2, 3
DEPLOYMENT_LABEL = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
TOKEN_ENV = {"a": "TENANTGATE_AUDIT_TOKEN_A", "b": "TENANTGATE_AUDIT_TOKEN_B"}
API_KEY_ENV = "TENANTGATE_AUDIT_API_KEY"

logger = logging.getLogger("tenantgate.cache_audit")


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("must be a whole number, 1 or more")
    return int(text)


def _trials(text: str) -> int:
    if not text.isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError("must be a whole number, 2 or more")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError("must be a whole number, 0 or more")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def _alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a number between 0 and 1") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError("must be a number between 0 and 1")
    return value


def _deployment(text: str) -> str:
    if not DEPLOYMENT_LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError("must be 1 to 64 letters, digits or _.:- (it becomes a metric label)")
    return text


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a JSON object") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    cache = subparsers.add_parser("cache", help="prefix cache: audit a deployment for cross-namespace hits; "
                                                "a public segment's digest")
    commands = cache.add_subparsers(dest="cache_command", required=True)
    add_segment_parser(commands)
    audit = commands.add_parser("audit", help="a timing audit: does the cache cross namespaces?", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = audit.add_subparsers(dest="target", required=True, metavar="TARGET")

    common = argparse.ArgumentParser(add_help=False)
    bounds = common.add_argument_group("bounds and statistics")
    bounds.add_argument("--trials", type=_trials, default=30,
                        help="trials that give samples (4 requests each; default 30)")
    bounds.add_argument("--warmup", type=_count, default=1, help="trials first, not counted (default 1)")
    bounds.add_argument("--max-requests", type=_positive_int, default=400,
                        help="requests at most, warm-up included (default 400)")
    bounds.add_argument("--max-seconds", type=_seconds, default=600.0, help="wall time at most (default 600)")
    bounds.add_argument("--concurrency", type=_positive_int, default=1,
                        help="trials in flight at once (default 1: sequential, so probes never time each other)")
    bounds.add_argument("--prefix-tokens", type=_positive_int, default=64,
                        help="prefix length: token ids, or common words (about a token each) over HTTP "
                             "(default 64; longer prefixes make a hit easier to see)")
    bounds.add_argument("--alpha", type=_alpha, default=0.01, help="significance level of both tests (default 0.01)")
    bounds.add_argument("--seed", type=int, help="draw the same prefixes again (tests only: reused prefixes "
                                                 "may be cached from an earlier run)")
    out = common.add_argument_group("output")
    out.add_argument("--deployment", type=_deployment,
                     help="the deployment's name in the output and the metrics' deployment label "
                          "(default: the target kind)")
    out.add_argument("--json", action="store_true", help="print the result as one JSON object")
    out.add_argument("--textfile", type=Path, metavar="FILE",
                     help="write the gauges to FILE (node exporter's textfile collector; replaced atomically)")
    out.add_argument("--pushgateway", metavar="URL", help="push the gauges to a Prometheus Pushgateway")

    embedded = kinds.add_parser("embedded", parents=[common], help="an engine in this process, two envelopes")
    embedded.add_argument("--model", default="demo", help="as for `tenantgate generate` (default demo)")
    embedded.add_argument("--scope", choices=["tenant", "shared"], default="tenant",
                          help="tenant: a namespace each, as two tenants get (default); shared: one namespace for "
                               "both, a configuration that must leak (checks that the audit sees a leak)")
    embedded.add_argument("--threads", type=_positive_int, help="CPU threads (default: the engine's)")
    embedded.add_argument("--device", default="auto")
    embedded.add_argument("--kv-cache-memory", type=_positive_int, default=256 << 20,
                          help="bytes for the paged KV cache")
    embedded.set_defaults(func=_audit, build=_embedded)

    replica = kinds.add_parser("replica", parents=[common], help="a `tenantgate engine serve` replica")
    replica.add_argument("--url", required=True, help="the replica's base URL")
    replica.add_argument("--envelope-signing-key", type=Path, metavar="PEM",
                         default=os.environ.get("TENANTGATE_ENVELOPE_SIGNING_KEY"),
                         help="an Ed25519 key the replica accepts envelopes from "
                              "(default $TENANTGATE_ENVELOPE_SIGNING_KEY)")
    replica.add_argument("--scope", choices=["tenant", "shared"], default="tenant", help="as for embedded")
    replica.add_argument("--vocab-size", type=_positive_int, default=8192,
                         help="token ids are drawn below this (default 8192; at most the model's vocabulary)")
    replica.set_defaults(func=_audit, build=_replica)

    for name, help_text in (("upstream", "an OpenAI-compatible server (vLLM, SGLang, llama.cpp's llama-server)"),
                            ("gateway", "a tenantgate gateway, as two tenants (a bearer token each)")):
        http = kinds.add_parser(name, parents=[common], help=help_text)
        http.add_argument("--url", required=True, help="the API's base URL, up to /v1")
        http.add_argument("--model", required=True, help="the model name to ask for")
        http.add_argument("--route", choices=["completions", "chat.completions"], default="completions",
                          help="completions (default: the prefix is the prompt, exactly) or chat.completions")
        http.add_argument("--timeout", type=_seconds, default=60.0, help="seconds a probe may take (default 60)")
        if name == "upstream":
            http.add_argument("--namespace-field", metavar="FIELD",
                              help="the body field the server partitions its cache by (cache_salt for vLLM and "
                                   "SGLang); without it, both namespaces send the same request (llama.cpp)")
            http.add_argument("--api-key-file", type=Path, metavar="FILE",
                              help=f"the server's API key, sent as a bearer token (default ${API_KEY_ENV})")
            http.add_argument("--extra-body", type=_json_object, metavar="JSON",
                              help='more body fields, e.g. \'{"cache_prompt": true}\'')
            http.set_defaults(func=_audit, build=_upstream)
        else:
            http.add_argument("--token-a-file", type=Path, metavar="FILE",
                              help=f"the victim tenant's bearer token (default ${TOKEN_ENV['a']})")
            http.add_argument("--token-b-file", type=Path, metavar="FILE",
                              help=f"the other tenant's bearer token (default ${TOKEN_ENV['b']})")
            http.set_defaults(func=_audit, build=_gateway)


class _Unusable(Exception):
    """An argument or input the audit cannot use (exit 2)."""


def _read_token(path: Path | None, namespace: str) -> str:
    if path is not None:
        try:
            token = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise _Unusable(f"cannot read the token file {path}: {exc.strerror}") from None
    else:
        token = os.environ.get(TOKEN_ENV[namespace], "").strip()
    if not token:
        raise _Unusable(f"give --token-{namespace}-file or set {TOKEN_ENV[namespace]}")
    return token


async def _embedded(args: argparse.Namespace):
    from engine import AsyncLLMEngine, EngineConfig, LLMEngine
    from gateway.cache import TokenTarget, audit_envelopes, token_prefixes

    config = EngineConfig(model=args.model, device=args.device, kv_cache_memory_bytes=args.kv_cache_memory,
                          threads=args.threads, max_num_seqs=max(4, args.concurrency))
    engine = AsyncLLMEngine(await asyncio.to_thread(LLMEngine, config))
    vocab = engine.engine.model_config.vocab_size
    target = TokenTarget(engine.generate, audit_envelopes(shared=args.scope == "shared"), vocab_size=vocab)
    return target, token_prefixes(args.prefix_tokens, vocab), engine.shutdown


async def _replica(args: argparse.Namespace):
    from engine.remote import EnvelopeSigner, load_private_key
    from gateway.cache import TokenTarget, audit_envelopes, token_prefixes
    from gateway.deployments.replica_client import ReplicaClient

    if args.envelope_signing_key is None:
        raise _Unusable("give --envelope-signing-key (or set TENANTGATE_ENVELOPE_SIGNING_KEY)")
    try:
        key = load_private_key(args.envelope_signing_key)
    except (OSError, ValueError) as exc:
        raise _Unusable(f"cannot use the envelope signing key {args.envelope_signing_key}: "
                        f"{getattr(exc, 'strerror', None) or 'not an Ed25519 private key in PEM'}") from None
    client = ReplicaClient(args.url, EnvelopeSigner(key), name="replica")
    target = TokenTarget(client.generate, audit_envelopes(shared=args.scope == "shared"), vocab_size=args.vocab_size)
    return target, token_prefixes(args.prefix_tokens, args.vocab_size), client.aclose


async def _upstream(args: argparse.Namespace):
    from gateway.cache import OpenAITarget, text_prefixes

    if args.api_key_file is not None:
        try:
            api_key: str | None = args.api_key_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise _Unusable(f"cannot read the API key file {args.api_key_file}: {exc.strerror}") from None
    else:
        api_key = os.environ.get(API_KEY_ENV)
    target = OpenAITarget(args.url, args.model, route=args.route, namespace_field=args.namespace_field,
                          bearer={"a": api_key, "b": api_key} if api_key else None, extra_body=args.extra_body,
                          timeout_s=args.timeout)
    return target, text_prefixes(args.prefix_tokens), target.aclose


async def _gateway(args: argparse.Namespace):
    from gateway.cache import OpenAITarget, text_prefixes

    bearer = {"a": _read_token(args.token_a_file, "a"), "b": _read_token(args.token_b_file, "b")}
    target = OpenAITarget(args.url, args.model, route=args.route, bearer=bearer, timeout_s=args.timeout)
    return target, text_prefixes(args.prefix_tokens), target.aclose


async def _run(args: argparse.Namespace, budget):
    from gateway.cache import run_audit

    target, prefixes, close = await args.build(args)
    try:
        return await run_audit(target, prefixes, budget=budget, alpha=args.alpha, seed=args.seed)
    finally:
        closed = close()
        if asyncio.iscoroutine(closed):
            await closed


def _audit(args: argparse.Namespace) -> int:
    from engine import ConfigError, EngineDeadError, RequestError
    from gateway.cache import AuditBudget, AuditTargetError, Verdict
    from gateway.deployments.base import UpstreamRejected, UpstreamUnavailable

    deployment = args.deployment or args.target
    try:
        budget = AuditBudget(trials=args.trials, max_requests=args.max_requests, max_seconds=args.max_seconds,
                             concurrency=args.concurrency, warmup_trials=args.warmup)
    except ValueError as exc:
        print(f"tenantgate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = asyncio.run(_run(args, budget))
    except _Unusable as exc:
        print(f"tenantgate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (AuditTargetError, UpstreamUnavailable, UpstreamRejected, EngineDeadError,
            RequestError) as exc:
        print(f"tenantgate: error: deployment {deployment}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ConfigError, ValueError, OSError):
        raise  # engine.cli.run reports them (exit 2)
    except Exception as exc:  # noqa: BLE001 - a crash must not exit 1, which says "leak"
        print(f"tenantgate: error: the audit of {deployment} failed: {type(exc).__name__}", file=sys.stderr)
        return EXIT_USAGE
    logger.info("cache audit of %s: %s", deployment, json.dumps(result.as_dict()))
    if args.json:
        print(json.dumps({"deployment": deployment, **result.as_dict()}))
    else:
        _print_report(deployment, result)
    exporters: list[tuple[str, Callable]] = []
    if args.textfile is not None or args.pushgateway:
        from gateway.cache.metrics import audit_registry, push, write_textfile

        registry = audit_registry(deployment, result)
        if args.textfile is not None:
            exporters.append((f"the textfile {args.textfile}", lambda: write_textfile(args.textfile, registry)))
        if args.pushgateway:
            exporters.append(("the Pushgateway", lambda: push(args.pushgateway, deployment, registry)))
    for where, export in exporters:
        try:
            export()
        except OSError as exc:
            print(f"tenantgate: error: could not write the metrics to {where}: {type(exc).__name__}", file=sys.stderr)
            return EXIT_USAGE
    return {Verdict.NO_LEAK: EXIT_NO_LEAK, Verdict.LEAK: EXIT_LEAK}.get(result.verdict, EXIT_INCONCLUSIVE)


def _print_report(deployment: str, result) -> None:
    from gateway.cache import Verdict

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None or seconds != seconds else f"{seconds * 1000:.1f} ms"

    meaning = {
        Verdict.LEAK: "LEAK: a prefix cached under one namespace is a hit under another",
        Verdict.NO_LEAK: "no leak found: cross-namespace probes time like misses",
        Verdict.INCONCLUSIVE: "INCONCLUSIVE: the positive control was not significant, so the audit cannot see "
                              "hits here (more trials, a longer prefix, or a deployment that caches nothing)",
    }[result.verdict]
    print(f"cache audit of {deployment}: {meaning}")
    for name, c in (("cross  ", result.cross), ("control", result.control)):
        print(f"  {name} KS D = {c.statistic:.3f}, p = {c.p_value:.3g} (alpha {result.alpha:g}), "
              f"n = {c.n_probe} vs {c.n_baseline} misses, median TTFT {ms(c.probe_median_s)} vs "
              f"{ms(c.baseline_median_s)}")
    print(f"  {result.trials} trials, {result.requests} requests, {result.elapsed_s:.1f} s "
          f"(stopped by {result.stopped_by})")
