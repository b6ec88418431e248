"""The `tenantgate` command line: serve the gateway, run an engine replica, mint development
tokens, work with policies, audit trails and usage reports, audit a deployment's prefix cache, and
generate from a local model."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from types import ModuleType

from engine.cli import add_parser as add_generate_parser
from engine.cli import run
from engine.remote.cli import add_parser as add_engine_parser
from gateway.audit.cli import add_parser as add_audit_parser
from gateway.cache.cli import add_parser as add_cache_parser
from gateway.cli import add_parser as add_serve_parser
from gateway.mcp.cli import add_parser as add_mcp_parser
from gateway.policy.cli import add_parser as add_policy_parser
from gateway.usage.cli import add_parser as add_usage_parser


def _development_commands() -> ModuleType | None:
    """devkit.cli (`tenantgate token`, the app of `serve --dev`) where the development helpers are
    installed, as a checkout's `pip install -e .` installs them; None in the product image, which
    leaves them out. The product's one import of devkit (the import contracts in pyproject.toml)."""
    if importlib.util.find_spec("devkit") is None:
        return None
    import devkit.cli

    return devkit.cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tenantgate", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine events to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    development = _development_commands()
    add_generate_parser(sub)
    add_audit_parser(sub)
    add_cache_parser(sub)
    add_engine_parser(sub)
    add_mcp_parser(sub)
    add_policy_parser(sub)
    add_serve_parser(sub, dev_app=development.create_dev_app if development else None)
    if development is not None:
        development.add_parser(sub)
    add_usage_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
