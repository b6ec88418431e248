"""`tenantgate policy …`: test, eval, check, fmt and bundle the Rego policy library.

Exit codes: 0 success, 1 a test/check failed, 2 a syntax error or unusable arguments.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

from gateway.policy.exceptions import DecisionSchemaError, PolicyError, PolicySyntaxError
from gateway.policy.loader import DEFAULT_POLICY_DIR, load_samples, load_source, new_engine

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _syntax_exit(exc: PolicySyntaxError) -> int:
    print(f"{exc.path}:{exc.line}: {exc.message}", file=sys.stderr)
    return EXIT_USAGE


def cmd_test(args: argparse.Namespace) -> int:
    from gateway.policy.regotest import run_tests

    try:
        report = run_tests(Path(args.dir), coverage=args.coverage or args.min_coverage is not None)
    except PolicySyntaxError as exc:
        return _syntax_exit(exc)
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for failure in report.failures:
        print(f"FAIL {failure.path}:{failure.line}: {failure.rule}")
        for line in failure.detail.splitlines():
            print(f"    {line}")
    status = EXIT_FAILED if report.failed else EXIT_OK
    if report.coverage:
        for path, (covered, total) in report.coverage.items():
            percent = 100.0 * covered / total if total else 100.0
            print(f"coverage {path}: {percent:.1f}% ({covered}/{total} lines)")
        print(f"coverage total: {report.coverage_percent:.1f}%")
        if args.min_coverage is not None and report.coverage_percent < args.min_coverage:
            print(f"coverage {report.coverage_percent:.1f}% is below --min-coverage {args.min_coverage}")
            status = EXIT_FAILED
    print(f"{report.passed} passed, {report.failed} failed")
    return status


def cmd_eval(args: argparse.Namespace) -> int:
    from gateway.policy.evaluator import EmbeddedEvaluator

    try:
        input_document = json.loads(Path(args.input).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        print(f"error: cannot read input {args.input}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        evaluator = EmbeddedEvaluator(Path(args.dir), Path(args.data) if args.data else None)
        decision = evaluator.evaluate(input_document)
    except PolicySyntaxError as exc:
        return _syntax_exit(exc)
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(decision, indent=2, sort_keys=True))
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    from gateway.policy.evaluator import EmbeddedEvaluator
    from gateway.policy.schema import validate_decision

    policy_dir = Path(args.dir)
    try:
        new_engine(load_source(policy_dir, include_tests=True))  # parses every file, tests too
        evaluator = EmbeddedEvaluator(policy_dir, Path(args.data) if args.data else None)
        samples = load_samples(policy_dir)
    except PolicySyntaxError as exc:
        return _syntax_exit(exc)
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    problems = []
    for name, (path, sample) in samples.items():
        if path.stem != name:
            problems.append(f"{path}: holds sample {name!r}; the key must equal the file name")
        try:
            validate_decision(evaluator.evaluate(sample["input"]))
        except DecisionSchemaError as exc:
            problems.extend(f"sample {name}: decision.{p}" for p in exc.problems)
        except PolicyError as exc:
            problems.append(f"sample {name}: {exc}")
        try:
            validate_decision(sample.get("expected"))
        except DecisionSchemaError as exc:
            problems.extend(f"sample {name}: expected.{p}" for p in exc.problems)
    for problem in problems:
        print(problem)
    print(f"checked {len(samples)} samples: {len(problems)} problems")
    return EXIT_FAILED if problems else EXIT_OK


def cmd_fmt(args: argparse.Namespace) -> int:
    from gateway.policy.opa import OPA_VERSION, find_opa

    opa = find_opa()
    if opa is None:
        print(
            f"policy fmt needs OPA {OPA_VERSION} (opa fmt); run scripts/install-opa.sh first",
            file=sys.stderr,
        )
        return EXIT_USAGE
    command = [opa, "fmt", "--list"] + (["--fail"] if args.check else ["--write"]) + [args.dir]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    for line in result.stdout.splitlines():
        print(f"needs formatting: {line}" if args.check else f"formatted: {line}")
    if result.stderr.strip():
        print(result.stderr.strip(), file=sys.stderr)
    return EXIT_OK if result.returncode == 0 else EXIT_FAILED


def cmd_bundle(args: argparse.Namespace) -> int:
    from gateway.policy.bundle import build_bundle

    try:
        key = Path(args.signing_key).read_bytes()
        revision = build_bundle(
            Path(args.out),
            key,
            key_id=args.key_id,
            policy_dir=Path(args.dir),
            data_dir=Path(args.data) if args.data else None,
        )
    except PolicySyntaxError as exc:
        return _syntax_exit(exc)
    except (OSError, ValueError, PolicyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {args.out} (revision {revision}, key id {args.key_id})")
    return EXIT_OK


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Registers `policy` and its subcommands; each sets func(args) -> exit code."""
    policy = subparsers.add_parser("policy", help="test, evaluate, check and ship the Rego policies")
    commands = policy.add_subparsers(dest="policy_command", required=True)
    default_dir = str(DEFAULT_POLICY_DIR)

    test = commands.add_parser("test", help="run the test_ rules with regorus")
    test.add_argument("dir", nargs="?", default=default_dir, help="policy directory")
    test.add_argument("--coverage", action="store_true", help="print line coverage")
    test.add_argument("--min-coverage", type=float, metavar="N", help="fail below N percent")
    test.set_defaults(func=cmd_test)

    evaluate = commands.add_parser("eval", help="print the decision for one input")
    evaluate.add_argument("--input", required=True, help="input document (JSON)")
    evaluate.add_argument("--data", help="data directory loaded at the root of data")
    evaluate.add_argument("--dir", default=default_dir, help="policy directory")
    evaluate.set_defaults(func=cmd_eval)

    check = commands.add_parser("check", help="parse all files; validate every sample's decision")
    check.add_argument("--dir", default=default_dir, help="policy directory")
    check.add_argument("--data", help="data directory loaded at the root of data")
    check.set_defaults(func=cmd_check)

    fmt = commands.add_parser("fmt", help="format with opa fmt")
    fmt.add_argument("--check", action="store_true", help="only report files needing formatting")
    fmt.add_argument("--dir", default=default_dir, help="policy directory")
    fmt.set_defaults(func=cmd_fmt)

    bundle = commands.add_parser("bundle", help="build a signed OPA bundle")
    bundle.add_argument("--out", required=True, help="bundle file to write (.tar.gz)")
    bundle.add_argument("--signing-key", required=True, help="PEM private key (RSA or EC P-256)")
    bundle.add_argument("--key-id", default="tenantgate", help="key id OPA's config names")
    bundle.add_argument("--dir", default=default_dir, help="policy directory")
    bundle.add_argument("--data", help="tenant data directory (default: DIR/data)")
    bundle.set_defaults(func=cmd_bundle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tenantgate")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
