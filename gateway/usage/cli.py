"""`tenantgate usage report`: usage per tenant, principal, model and deployment from the audit trail.

    tenantgate usage report --from 2026-12-01 --to 2026-12-02 --format csv \
        --audit-file /var/log/tenantgate/audit.jsonl --public-key audit-signing.pub.pem \
        [--prices prices.json] [--names tenants.json]

The rotated files (audit.jsonl.N … audit.jsonl) are read oldest first and verified as they are
read. Exit codes: 0 the report, 1 the trail failed verification (no report is printed),
2 unusable arguments or unreadable input. docs/operations.md ("Usage and chargeback").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    usage = subparsers.add_parser("usage", help="usage and chargeback from the audit trail", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = usage.add_subparsers(dest="usage_command", required=True)
    report = commands.add_parser("report", help="tokens, KV block-seconds and engine time per tenant, principal, "
                                                "model and deployment")
    report.add_argument("--from", dest="start", required=True, metavar="WHEN",
                        help="ISO 8601 date or time, UTC unless it says otherwise (inclusive)")
    report.add_argument("--to", dest="end", required=True, metavar="WHEN", help="ISO 8601 date or time (exclusive)")
    report.add_argument("--format", choices=["csv", "json"], default="json")
    report.add_argument("--audit-file", type=Path, metavar="FILE",
                        help="the audit file's name (default TENANTGATE_AUDIT_FILE); its rotated files are read too")
    report.add_argument("--public-key", action="append", metavar="KEY",
                        help="Ed25519 public key (PEM) of the trail, repeatable (default: the public half of "
                             "TENANTGATE_AUDIT_SIGNING_KEY)")
    report.add_argument("--prices", type=Path, metavar="FILE",
                        help="prices per model (default TENANTGATE_USAGE_PRICES_FILE): adds a cost column")
    report.add_argument("--names", type=Path, metavar="FILE",
                        help="a JSON object of tenant ids to names: adds a tenant_name column")
    report.add_argument("--strict", action="store_true",
                        help="also refuse a trail that part of no signature vouches for (see `audit verify --strict`)")
    report.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from gateway.audit import AuditRecorder, load_or_create_signing_key, load_public_key, trail_files
    from gateway.cli import load_settings
    from gateway.usage import TrailRejected, UsageError, load_names, load_prices, parse_time, read_usage, to_csv

    settings = load_settings()
    try:
        start, end = parse_time(args.start, "--from"), parse_time(args.end, "--to")
        audit_file = args.audit_file or settings.audit_file
        if audit_file is None:
            raise UsageError("give --audit-file (or set TENANTGATE_AUDIT_FILE)")
        if args.public_key:
            keys = [load_public_key(Path(path).read_bytes()) for path in args.public_key]
        elif settings.audit_signing_key is not None and settings.audit_signing_key.exists():
            keys = [load_or_create_signing_key(settings.audit_signing_key).public_key()]
        else:
            raise UsageError("give --public-key (or set TENANTGATE_AUDIT_SIGNING_KEY)")
        prices_file = args.prices or settings.usage_prices_file
        prices = load_prices(prices_file) if prices_file is not None else None
        names = None
        if args.names is not None:
            recorder = AuditRecorder(None, settings.namespace_key)
            names = {recorder.tenant_digest(tenant): name for tenant, name in load_names(args.names).items()}
        files = trail_files(audit_file)
        if not files:
            raise UsageError(f"no audit file at {audit_file}")
    except (UsageError, OSError, ValueError) as exc:
        print(f"tenantgate usage: {_message(exc)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        usage = read_usage(files, keys, start, end, strict=args.strict)
    except UsageError as exc:
        print(f"tenantgate usage: {exc}", file=sys.stderr)
        return EXIT_FAILED if isinstance(exc, TrailRejected) else EXIT_USAGE
    document = usage.document(prices, names)
    for warning in usage.audit["warnings"]:
        print(f"tenantgate usage: warning: {warning}", file=sys.stderr)
    sys.stdout.write(to_csv(document) if args.format == "csv" else json.dumps(document, indent=2) + "\n")
    return EXIT_OK


def _message(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return f"cannot read {exc.filename or 'a file'}: {exc.strerror}"
    return str(exc)
