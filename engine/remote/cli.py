"""`tenantgate engine serve`: an engine server that runs only envelopes a gateway signed."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys

from engine.model.catalog import DEFAULT_MODEL
from engine.remote.edge import EdgeLimits

# A replica's listener: gateways on the pod network send bodies from memory, so a body gets
# a tighter deadline than the gateway's public port gives one.
EDGE = EdgeLimits(body_timeout_s=10.0)

PUBLIC_KEYS_ENV = "TENANTGATE_ENGINE_ENVELOPE_PUBLIC_KEYS"
RECORD_KEY_ENV = "TENANTGATE_RECORD_KEY"  # the gateway's setting of the same name: records compare across hosts
EXIT_CONFIG = 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    engine = subparsers.add_parser("engine", help="run the decode engine as a service for gateways")
    commands = engine.add_subparsers(dest="engine_command", required=True)
    serve = commands.add_parser("serve", help="serve the engine over HTTP; only gateway-signed envelopes run")
    serve.add_argument("--model", default=DEFAULT_MODEL, help=f"as for `tenantgate generate` (default {DEFAULT_MODEL})")
    serve.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8100, help="listen port (default 8100)")
    serve.add_argument("--envelope-public-keys", metavar="PATH", default=os.environ.get(PUBLIC_KEYS_ENV),
                       help="the gateways' Ed25519 public keys: a PEM file or a directory of them "
                            f"(required; default ${PUBLIC_KEYS_ENV})")
    serve.add_argument("--kv-cache-memory", type=int, default=256 << 20, help="bytes for the paged KV cache")
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                       help="CUDA: the share of device memory for weights, activations and the KV cache "
                            "(0: --kv-cache-memory instead)")
    serve.add_argument("--enforce-eager", action="store_true", help="CUDA: decode without CUDA graphs")
    serve.add_argument("--max-num-seqs", type=int, default=64, help="sequences decoded at once")
    serve.add_argument("--max-model-len", type=int, default=None,
                       help="longest sequence in tokens; default: the model's context, or what the KV cache holds")
    serve.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    serve.add_argument("--device", default="auto")
    serve.add_argument("--shutdown-timeout", type=float, default=20.0, metavar="SECONDS",
                       help="on SIGTERM, how long running requests may finish (default 20)")
    serve.add_argument("--max-header-bytes", type=int, default=EDGE.max_header_bytes, metavar="BYTES",
                       help=f"a request line and headers over this get 431 (default {EDGE.max_header_bytes})")
    serve.add_argument("--header-timeout", type=float, default=EDGE.header_timeout_s, metavar="SECONDS",
                       help="from a request's first byte to its last header; then 408 "
                            f"(default {EDGE.header_timeout_s:g})")
    serve.add_argument("--body-timeout", type=float, default=EDGE.body_timeout_s, metavar="SECONDS",
                       help="from a request's last header to its last body byte; then 408 "
                            f"(default {EDGE.body_timeout_s:g})")
    serve.add_argument("--max-connections", type=int, default=EDGE.max_connections,
                       help=f"open connections; more get 503 and are closed (default {EDGE.max_connections})")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=_serve)


def _edge_problem(args: argparse.Namespace) -> str | None:
    from engine.remote.signing import MAX_TOKEN_BYTES

    if args.max_header_bytes < MAX_TOKEN_BYTES + 1024:
        return f"--max-header-bytes must leave room for an envelope token ({MAX_TOKEN_BYTES} bytes) and 1 KiB more"
    if not (args.header_timeout > 0 and args.body_timeout > 0 and args.max_connections > 0):
        return "--header-timeout, --body-timeout and --max-connections must be positive"
    return None


def _serve(args: argparse.Namespace) -> int:
    from engine.remote.signing import EnvelopeVerifier, load_public_keys

    if problem := _edge_problem(args):
        print(f"tenantgate: error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    if not args.envelope_public_keys:
        print(f"tenantgate: error: --envelope-public-keys (or {PUBLIC_KEYS_ENV}) is required: "
              "the engine server runs only envelopes signed by a gateway whose public key it holds", file=sys.stderr)
        return EXIT_CONFIG
    keys = load_public_keys(args.envelope_public_keys)
    if not keys:
        print(f"tenantgate: error: no public key in {args.envelope_public_keys}", file=sys.stderr)
        return EXIT_CONFIG
    verifier = EnvelopeVerifier(keys)

    import uvicorn  # here, after the checks that need none of it

    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.model.catalog import served_model_name
    from engine.remote.edge import edge_config
    from engine.remote.server import MAX_BODY_BYTES, EngineServer, create_app

    config = EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, kv_cache_memory_bytes=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization or None, enforce_eager=args.enforce_eager,
        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
        record_key=os.environ.get(RECORD_KEY_ENV, "").encode(),
    )
    server = EngineServer(LLMEngine(config), verifier, model_name=served_model_name(args.model))
    logging.getLogger("tenantgate.engine.server").info(
        "accepting envelopes signed by key ids %s", ", ".join(verifier.key_ids))
    app = create_app(server)
    limits = EdgeLimits(max_header_bytes=args.max_header_bytes, max_body_bytes=MAX_BODY_BYTES,
                        header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                        max_connections=args.max_connections)
    # The model and the server are built: out of the cyclic collector's reach, so that its full passes
    # walk the requests' objects only, not the whole process, on the loop every tenant shares
    # (gateway/app.py, freeze_startup_heap, has the figures).
    gc.collect()
    gc.freeze()
    uvicorn.Server(edge_config(app, limits, host=args.host, port=args.port, log_level=args.log_level,
                               timeout_graceful_shutdown=args.shutdown_timeout)).run()
    return 0
