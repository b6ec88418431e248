"""docs/api.md's table of agent clients says what the tests beside this file show (issue 25): each
test has its row and each row its test, a row says yes exactly when its test must pass (no as a
strict expected failure, which fails CI once it passes), and each row's version is the one its
client's venv pins. With the tests themselves in the same `make test`, a green run is the table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.clients.conftest import REPOSITORY, REQUIREMENTS

HERE = Path(__file__).parent
SECTION = re.compile(r"^### Agent clients\n(.*?)(?=^#)", re.DOTALL | re.MULTILINE)
ROW = re.compile(r"^\| `([\w.-]+==[\w.]+)` \| (.+?) \| (yes|no: .+?) \| `(test_\w+\.py)::(test_\w+)` \|$", re.MULTILINE)


def table_rows() -> list[tuple[str, str, str, str]]:
    """(pin, verdict, file, test) for each row of the table."""
    section = SECTION.search((REPOSITORY / "docs" / "api.md").read_text())
    assert section, "docs/api.md has no '### Agent clients' section"
    lines = [line for line in section.group(1).splitlines() if line.startswith("| `")]
    rows = [(m.group(1), m.group(3), m.group(4), m.group(5)) for m in map(ROW.match, lines) if m]
    assert len(rows) == len(lines), f"rows not in the table's form: {[line for line in lines if not ROW.match(line)]}"
    return rows


def _expected_to_fail(function: ast.FunctionDef) -> bool:
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "pytest.mark.xfail":
            assert any(k.arg == "strict" and ast.literal_eval(k.value) is True for k in decorator.keywords), \
                f"{function.name}: an expected failure in tests/clients must be strict"
            return True
    return False


def client_tests() -> dict[tuple[str, str], tuple[str, bool]]:
    """(file, test) -> (the client venv it runs in, whether it is expected to fail), for each test."""
    tests = {}
    for path in sorted(HERE.glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        source = path.read_text()
        venvs = set(re.findall(r'run_flow\("([\w-]+)"', source))
        assert len(venvs) == 1, f"{path.name} runs flows in {venvs or 'no venv'}, not one client's"
        (venv,) = venvs
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                tests[(path.name, node.name)] = (venv, _expected_to_fail(node))
    return tests


def test_every_client_test_has_one_row_and_every_row_a_test() -> None:
    rows = [(file, test) for _, _, file, test in table_rows()]
    assert len(rows) == len(set(rows)), "a test has two rows"
    assert set(rows) == set(client_tests())


def test_each_rows_verdict_is_its_tests_marking() -> None:
    tests = client_tests()
    for _, verdict, file, test in table_rows():
        assert (verdict != "yes") == tests[(file, test)][1], f"{file}::{test}: the table says {verdict!r}"


def test_each_rows_version_is_its_clients_pin() -> None:
    tests = client_tests()
    for pin, _, file, test in table_rows():
        venv = tests[(file, test)][0]
        pins = (REQUIREMENTS / f"{venv}.txt").read_text().splitlines()
        assert pin in pins, f"{file}::{test}: {pin} is not pinned in tests/clients/requirements/{venv}.txt"
