"""The `tenantgate` command line: serve the gateway, run an engine replica, mint development
tokens, work with policies, audit trails and usage reports, and generate from a local model."""

from __future__ import annotations

import argparse
import sys

from engine.cli import add_parser as add_generate_parser
from engine.cli import run
from engine.remote.cli import add_parser as add_engine_parser
from gateway.audit.cli import add_parser as add_audit_parser
from gateway.auth.cli import add_parser as add_token_parser
from gateway.cli import add_parser as add_serve_parser
from gateway.policy.cli import add_parser as add_policy_parser
from gateway.usage.cli import add_parser as add_usage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tenantgate", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine events to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(sub)
    add_audit_parser(sub)
    add_engine_parser(sub)
    add_policy_parser(sub)
    add_serve_parser(sub)
    add_token_parser(sub)
    add_usage_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
