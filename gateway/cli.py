"""`tenantgate serve`: the gateway under uvicorn, configured by TENANTGATE_* settings."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable

EXIT_CONFIG = 2


def add_parser(subparsers: argparse._SubParsersAction, dev_app: Callable | None = None) -> None:
    """dev_app(settings) builds the app of `serve --dev` (with its local issuer); None where the
    development helpers are not installed (the product image), and then `--dev` is refused."""
    serve = subparsers.add_parser("serve", help="serve the OpenAI-compatible gateway")
    serve.add_argument("--host", help="listen address (default: TENANTGATE_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default: TENANTGATE_PORT or 8000)")
    serve.add_argument("--dev", action="store_true",
                       help="development: run a local Entra-style token issuer (`tenantgate token` mints for it)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--workers", type=_workers,
                       help="processes serving the port (default: TENANTGATE_WORKERS or 1); more than one needs a "
                            "deployments file and TENANTGATE_REDIS_URL (docs/operations.md, \"Workers\")")
    serve.add_argument("--worker-fd", type=int, help=argparse.SUPPRESS)  # a worker's inherited API socket
    serve.set_defaults(func=_serve, dev_app=dev_app)


def _workers(text: str) -> int:
    from gateway.workers import MAX_WORKERS

    if not text.isdigit() or not 1 <= int(text) <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_WORKERS}")
    return int(text)


def load_settings(**overrides):
    """Settings from the environment; a bad value exits with the field and rule, never the value."""
    from pydantic import ValidationError

    from gateway.settings import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        for error in exc.errors(include_input=False, include_url=False):
            field = ".".join(str(p) for p in error["loc"]) or "settings"
            print(f"tenantgate: invalid setting {field}: {error['msg']}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from engine.remote import edge_config
    from gateway.app import create_app

    overrides = {"host": args.host, "port": args.port, "workers": args.workers}
    if args.dev:
        overrides["dev_issuer"] = True  # refused by the settings if the environment is production
    settings = load_settings(**overrides)  # logging is configured once, by engine.cli.run
    from gateway.deployments.config import DeploymentsError, deployments_for
    from gateway.tracing import TracingError, traces_enabled

    try:
        deployments = deployments_for(settings)  # a bad file is refused here, not as a start-up traceback
        traces_enabled()  # and so are OTEL_* variables the gateway cannot follow
    except (DeploymentsError, TracingError) as exc:
        print(f"tenantgate: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if settings.workers > 1 and args.worker_fd is None:
        if deployments is not None and deployments.models_of_kind("embedded"):
            print("tenantgate: error: workers > 1 is refused with an embedded deployment in the deployments file: "
                  "each worker would load its own engine", file=sys.stderr)
            return EXIT_CONFIG
        return _supervise(args, settings)
    if settings.dev_issuer and args.dev_app is None:
        print("tenantgate: error: the development issuer needs the development helpers (devkit), "
              "which this installation does not have", file=sys.stderr)
        return EXIT_CONFIG
    if settings.dev_issuer:
        _print_dev_instructions(settings)
    app = args.dev_app(settings) if settings.dev_issuer else create_app(settings)
    config = edge_config(app, settings.edge_limits, host=settings.host, port=settings.port, log_level=args.log_level,
                         timeout_graceful_shutdown=settings.shutdown_timeout_s)
    if args.worker_fd is None:
        uvicorn.Server(config).run()
        return 0
    from gateway.workers import watch_supervisor

    watch_supervisor(os.getppid())
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=args.worker_fd)])
    return 0


def _supervise(args: argparse.Namespace, settings) -> int:
    """`serve --workers N`: binds the port once and runs N workers on it (gateway/workers.py)."""
    from gateway.workers import Supervisor, bind_listener, worker_env

    try:
        listener = bind_listener(settings.host, settings.port)
    except OSError as exc:
        print(f"tenantgate: error: cannot listen on {settings.host}:{settings.port}: {exc.strerror}", file=sys.stderr)
        return EXIT_CONFIG
    verbose = ["-v"] if args.verbose else []
    command = [sys.executable, "-m", "gateway.main", *verbose, "serve", "--worker-fd", str(listener.fileno()),
               "--log-level", args.log_level]
    print(f"tenantgate: {settings.workers} workers on http://{settings.host}:{listener.getsockname()[1]}",
          file=sys.stderr, flush=True)
    supervisor = Supervisor(settings.workers, lambda index: command,
                            lambda index: worker_env(index, settings.metrics_port), listener=listener,
                            shutdown_timeout_s=settings.shutdown_timeout_s)
    try:
        return supervisor.run()
    finally:
        listener.close()


def _print_dev_instructions(settings) -> None:
    from engine import served_model_name

    base = f"http://{settings.host}:{settings.port}"
    model = settings.served_model_name or served_model_name(settings.model)
    exe = os.path.relpath(sys.argv[0]) if sys.argv and sys.argv[0].endswith("tenantgate") else "tenantgate"
    print(f"""
tenantgate (development) on {base}: embedded engine ({settings.model}), embedded policy,
and a local token issuer on http://127.0.0.1:{settings.dev_issuer_port} with real RSA keys.

  TOKEN=$({exe} token --tenant northwind)     # a tenant from policies/data/tenants.example.json

  curl -s {base}/v1/chat/completions -H "Authorization: Bearer $TOKEN" \\
       -H 'Content-Type: application/json' \\
       -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "What is the capital of France?"}}]}}'

  python -c 'import os, openai; c = openai.OpenAI(base_url="{base}/v1", api_key=os.environ["TOKEN"]);
print(c.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Hello"}}]).choices[0].message.content)'
""", flush=True)  # noqa: E501 - the one-liner is printed to be copied whole
