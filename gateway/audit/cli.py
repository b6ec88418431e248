"""`tenantgate audit …`: verify an audit chain, make its signing key.

    tenantgate audit keygen --out DIR
    tenantgate audit verify audit.jsonl.2 audit.jsonl.1 audit.jsonl --public-key DIR/audit-signing.pub.pem
    tenantgate audit verify --rotated audit.jsonl --public-key KEY        (the same, found for you)
    tenantgate audit verify --redis redis://host:6379/0 --stream tenantgate:audit --public-key KEY
    tenantgate audit verify --rotated audit.jsonl --public-key KEY --strict --anchors redis://host:6379/0

Exit codes: 0 the chain is intact (warnings, such as an unsigned tail, are printed),
1 tampering found, 2 unusable arguments, unreadable input or nothing to verify,
3 (--strict only) unverified: part of a chain is vouched for by no signature and no
live writer is about to sign it. docs/operations.md says what each verdict means.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

from gateway.audit.sinks import read_stream, trail_files
from gateway.audit.trail import load_or_create_signing_key, public_key_pem
from gateway.audit.verify import (
    DEFAULT_MAX_UNSIGNED_AGE_S,
    TAMPERED,
    VerifyReport,
    key_id,
    load_public_key,
    verify,
    verify_files,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNVERIFIED = 0, 1, 2, 3
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
KEY_NAME = "audit-signing"
MAX_WARNINGS = 5


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Registers `audit` and its subcommands; each sets func(args) -> exit code."""
    audit = subparsers.add_parser("audit", help="verify the tamper-evident audit trail", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = audit.add_subparsers(dest="audit_command", required=True)

    check = commands.add_parser("verify", help="report the first altered, deleted or reordered entry")
    check.add_argument("files", nargs="*", metavar="FILE", help="audit files, oldest first (one chain across rotation)")
    check.add_argument("--public-key", action="append", required=True, metavar="KEY",
                       help="Ed25519 public key (PEM); repeat for keys used before a rotation")
    check.add_argument("--rotated", action="store_true",
                       help="each FILE is a log name: verify FILE.N … FILE.1 FILE, then each worker's "
                            "(FILE.worker-I, rotated alike)")
    check.add_argument("--redis", metavar="URL", help="read the central copy from a Redis Stream instead of files")
    check.add_argument("--stream", default="tenantgate:audit", help="stream name (default tenantgate:audit)")
    check.add_argument("--anchors", action="append", default=[], metavar="SOURCE",
                       help="the trail's anchors: a Redis URL (its --anchor-stream) or an anchor file; repeatable")
    check.add_argument("--anchor-stream", default="tenantgate:audit:anchors",
                       help="anchor stream name (default tenantgate:audit:anchors)")
    check.add_argument("--strict", action="store_true",
                       help="exit 3 for what no signature vouches for: a chain with no checkpoint (or, with "
                            "--anchors, no anchor), an unsigned tail older than --max-unsigned-age")
    check.add_argument("--max-unsigned-age", type=float, default=DEFAULT_MAX_UNSIGNED_AGE_S, metavar="SECONDS",
                       help=f"with --strict: how old an unsigned tail may be (default {DEFAULT_MAX_UNSIGNED_AGE_S:g}; "
                            "more than the writers' TENANTGATE_AUDIT_CHECKPOINT_INTERVAL_S)")
    check.set_defaults(func=cmd_verify)

    keygen = commands.add_parser("keygen", help="write a new Ed25519 signing key pair")
    keygen.add_argument("--out", required=True, metavar="DIR", help=f"where {KEY_NAME}.pem and {KEY_NAME}.pub.pem go")
    keygen.set_defaults(func=cmd_keygen)


def _usage(message: str) -> int:
    print(f"tenantgate audit: {message}", file=sys.stderr)
    return EXIT_USAGE


class _Unreadable(Exception):
    """An input that cannot be read; the message is safe to print."""


def cmd_verify(args: argparse.Namespace) -> int:
    if bool(args.files) == bool(args.redis):
        return _usage("give audit FILEs or --redis URL (one of them)")
    try:
        keys = [load_public_key(Path(path).read_bytes()) for path in args.public_key]
    except (OSError, ValueError) as exc:
        return _usage(f"cannot load public key: {exc}")
    options = dict(strict=args.strict, max_unsigned_age_s=args.max_unsigned_age)
    try:
        if args.anchors:
            options["anchors"] = [a for source in args.anchors for a in _read_anchors(source, args.anchor_stream)]
        if args.redis:
            with _redis(args.redis, args.stream) as client:
                report = verify(read_stream(client, args.stream), keys, **options)
        else:
            files = [Path(f) for f in args.files]
            if args.rotated:
                files = [rotated for name in files for rotated in trail_files(name)]
            try:
                report = verify_files(files, keys, **options)
            except OSError as exc:
                raise _Unreadable(f"cannot read {exc.filename or 'an audit file'}: {exc.strerror}") from None
    except _Unreadable as exc:
        return _usage(str(exc))
    if report.records + report.checkpoints == 0 and report.ok:
        return _usage("no audit entries to verify")
    _print_report(report)
    if report.ok:
        return EXIT_OK
    return EXIT_FAILED if report.verdict == TAMPERED else EXIT_UNVERIFIED


def _read_anchors(source: str, stream: str) -> list[bytes]:
    if source.startswith(REDIS_SCHEMES):
        with _redis(source, stream) as client:
            return list(read_stream(client, stream))
    try:  # a rotated anchor file, and each worker's of `serve --workers`
        return [line for path in trail_files(source) or [Path(source)] for line in path.read_bytes().splitlines()]
    except OSError as exc:
        raise _Unreadable(f"cannot read anchors {exc.filename or source}: {exc.strerror}") from None


@contextmanager
def _redis(url: str, stream: str):
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=5)
    except ValueError as exc:
        raise _Unreadable(f"bad Redis URL: {exc}") from None
    try:
        yield client
    except (redis.RedisError, OSError) as exc:  # the message may quote the URL's password
        raise _Unreadable(f"cannot read stream {stream}: {type(exc).__name__}") from None
    finally:
        client.close()


def _print_report(report: VerifyReport) -> None:
    chains = f"{report.chains} chain" + ("" if report.chains == 1 else "s")
    counts = f"{report.records} records, {report.checkpoints} checkpoints, {chains}"
    if report.anchors:
        counts += f", {report.anchors} anchors"
    if report.ok:
        print(f"{'ok with warnings' if report.warnings else 'ok'}: {counts}")
    else:
        print(f"{report.verdict.upper()}: {counts}")
        where = f" (chain {report.chain})" if report.chain else ""
        print(f"first problem: {report.reason}{where}")
    for warning in report.warnings[:MAX_WARNINGS]:
        print(f"warning: {warning}")
    if len(report.warnings) > MAX_WARNINGS:
        print(f"… and {len(report.warnings) - MAX_WARNINGS} more warnings")


def cmd_keygen(args: argparse.Namespace) -> int:
    out = Path(args.out)
    private, public = out / f"{KEY_NAME}.pem", out / f"{KEY_NAME}.pub.pem"
    try:
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        if private.exists() or public.exists():
            return _usage(f"{out} already holds an audit key; refusing to replace it")
        key = load_or_create_signing_key(private)
        public.write_bytes(public_key_pem(key))
    except OSError as exc:
        return _usage(f"cannot write the key: {exc}")
    print(f"wrote {private} (private, mode 0600) and {public} (key id {key_id(key.public_key())})")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tenantgate")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
