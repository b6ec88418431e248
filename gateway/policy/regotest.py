"""Runs the `test_` rules of a policy directory in regorus, with optional line coverage."""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from gateway.policy.loader import load_source, new_engine

_PACKAGE = re.compile(r"^package\s+(\S+)", re.MULTILINE)
_TEST_RULE = re.compile(r"^(test_\w+)\b", re.MULTILINE)


@dataclass(frozen=True)
class TestFailure:
    path: str
    line: int
    rule: str
    detail: str


@dataclass
class TestReport:
    passed: int = 0
    failures: list[TestFailure] = field(default_factory=list)
    coverage: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (covered, total)

    @property
    def failed(self) -> int:
        return len(self.failures)

    @property
    def coverage_percent(self) -> float:
        covered = sum(c for c, _ in self.coverage.values())
        total = sum(t for _, t in self.coverage.values())
        return 100.0 * covered / total if total else 100.0


def discover_tests(modules: dict[str, str]) -> list[tuple[str, int, str, str]]:
    """(path, line, package, rule) for each distinct test_ rule, in file order."""
    found = []
    for path, text in modules.items():
        if not path.endswith("_test.rego"):
            continue
        package = _PACKAGE.search(text)
        if package is None:
            continue
        seen = set()
        for match in _TEST_RULE.finditer(text):
            rule = match.group(1)
            if rule in seen:
                continue
            seen.add(rule)
            line = text.count("\n", 0, match.start()) + 1
            found.append((path, line, package.group(1), rule))
    return found


def run_tests(policy_dir: Path, *, coverage: bool = False) -> TestReport:
    """Runs every test in a fresh clone of one parsed engine (a failed rule cannot taint the next)."""
    source = load_source(policy_dir, include_tests=True)
    template = new_engine(source)
    report = TestReport()
    covered: dict[str, set[int]] = {}
    all_lines: dict[str, set[int]] = {}
    for path, line, package, rule in discover_tests(source.modules):
        engine = template.clone()
        engine.set_gather_prints(True)
        if coverage:
            engine.set_enable_coverage(True)
        try:
            result = engine.eval_rule(f"data.{package}.{rule}")
            detail = "" if result is True else f"result: {json.dumps(result)}"
        except RuntimeError as exc:
            result = None
            detail = str(exc).split("Stack backtrace:")[0].strip()
        prints = engine.take_prints()
        if result is True:
            report.passed += 1
        else:
            if prints:
                detail = "\n".join([detail, *prints]).strip()
            report.failures.append(TestFailure(path, line, rule, detail or "undefined"))
        if coverage:
            for item in json.loads(engine.get_coverage_report_as_json())["files"]:
                if item["path"].endswith("_test.rego"):
                    continue
                covered.setdefault(item["path"], set()).update(item["covered"])
                all_lines.setdefault(item["path"], set()).update(item["covered"], item["not_covered"])
    if coverage:
        report.coverage = {
            path: (len(covered[path]), len(lines)) for path, lines in sorted(all_lines.items())
        }
    return report
