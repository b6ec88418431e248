"""Fixtures for the static checks of infra/: the tools, and one run of each per session.

The tools live outside the project's .venv (scripts/install-infra-tools.sh puts checkov,
kubernetes-validate and python-hcl2 in .venv-infra and helm in $(go env GOPATH)/bin). A missing
tool fails the tests with the command that installs it: `make test` runs that script first, so
a skip here would only hide an unchecked landing zone.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.utils.tools import find_go_binary, missing_tool

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
VENV_INFRA = REPO / ".venv-infra"
CUSTOM_CHECKS = INFRA / "checkov" / "checks"
CHART = INFRA / "helm" / "tenantgate"
KUBERNETES_VERSION = "1.33.0"
INSTALL_HINT = "run scripts/install-infra-tools.sh (make test does)"


@dataclass(frozen=True)
class Tools:
    checkov: Path
    kubernetes_validate: Path
    python: Path
    helm: Path


def require_go_binary(name: str) -> Path:
    """find_go_binary, or the missing-tool outcome (a skip locally, a failure under make test)."""
    found = find_go_binary(name)
    if found is None:
        missing_tool(f"{name} not found: run scripts/install-infra-tools.sh (make test does)")
    return found


@pytest.fixture(scope="session")
def tools() -> Tools:
    missing = [
        str(path)
        for path in (
            VENV_INFRA / "bin" / "checkov",
            VENV_INFRA / "bin" / "kubernetes-validate",
            VENV_INFRA / "bin" / "python",
            VENV_INFRA / "python-hcl2" / "hcl2",
        )
        if not path.exists()
    ]
    helm = find_go_binary("helm")
    if helm is None:
        missing.append("helm (on PATH or in $(go env GOPATH)/bin)")
    if missing:
        pytest.fail(f"infra tools missing: {', '.join(missing)}; {INSTALL_HINT}", pytrace=False)
    return Tools(
        checkov=VENV_INFRA / "bin" / "checkov",
        kubernetes_validate=VENV_INFRA / "bin" / "kubernetes-validate",
        python=VENV_INFRA / "bin" / "python",
        helm=helm,
    )


def run(
    command: list[str | Path], *, cwd: Path = REPO, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    # checkov must never phone home for guidelines or a platform key: the run is offline.
    env.pop("BC_API_KEY", None)
    return subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def parse_checkov_output(stdout: str) -> list[dict]:
    """checkov prints one JSON report per scanned directory (a list, an object, or several)."""
    decoder = json.JSONDecoder()
    reports: list[dict] = []
    position = 0
    while position < len(stdout):
        while position < len(stdout) and stdout[position].isspace():
            position += 1
        if position >= len(stdout):
            break
        document, position = decoder.raw_decode(stdout, position)
        reports.extend(document if isinstance(document, list) else [document])
    return reports


def checkov(tools: Tools, framework: str, target: str | Path) -> list[dict]:
    """Runs checkov offline with the project's custom checks on one directory or file.

    One target per run: given two `--directory` arguments, checkov 3.3.30 scanned the first
    Terraform example twice and never the second.
    """
    command: list[str | Path] = [tools.checkov, "--framework", framework, "--output", "json", "--compact"]
    command += ["--skip-download", "--external-checks-dir", CUSTOM_CHECKS]
    command += ["--file" if Path(target).is_file() else "--directory", target]
    result = run(command)
    # Exit 1 means failed checks (reported below); anything else is checkov itself failing.
    assert result.returncode in (0, 1), f"checkov exited {result.returncode}:\n{result.stderr[-4000:]}"
    # A custom check that does not load is logged and left out, and the scan passes without it.
    assert "Cannot load external check" not in result.stderr, result.stderr[-4000:]
    reports = parse_checkov_output(result.stdout)
    assert reports, f"checkov printed no report:\n{result.stderr[-4000:]}"
    return reports


def render_chart(tools: Tools, *extra: str) -> subprocess.CompletedProcess[str]:
    return run(
        [tools.helm, "template", "tg", CHART, "--namespace", "tenantgate", "--kube-version", KUBERNETES_VERSION, *extra]
    )


UPSTREAMS_VALUES = REPO / "tests" / "infra" / "values" / "upstreams.yaml"
PRODUCTION_VALUES = REPO / "tests" / "infra" / "values" / "production.yaml"
MONITORING_VALUES = REPO / "tests" / "infra" / "values" / "monitoring.yaml"
TERRAFORM_EXAMPLES = sorted(path for path in (INFRA / "terraform" / "examples").iterdir() if path.is_dir())

RENDER_MODES = {
    "embedded": (),
    "remote": ("--set", "engine.mode=remote"),
    "mig": ("--set", "engine.gpuResource=nvidia.com/mig-1g.10gb", "--set", "image.digest=sha256:" + "0" * 64),
    # Remote engines with an InferencePool upstream and a vLLM server from `deployments`.
    "upstreams": ("--values", str(UPSTREAMS_VALUES)),
    # What docs/deploy.md step 4 installs.
    "production": ("--values", str(PRODUCTION_VALUES)),
    # Remote engines with PodMonitors, the PrometheusRule, the dashboard ConfigMap and traces.
    "monitoring": ("--values", str(MONITORING_VALUES)),
}


@pytest.fixture(scope="session")
def rendered_manifests(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The chart rendered once per RENDER_MODES entry, each into its own file."""
    directory = tmp_path_factory.mktemp("rendered")
    files = {}
    for mode, extra in RENDER_MODES.items():
        result = render_chart(tools, *extra)
        assert result.returncode == 0, f"helm template ({mode}) failed:\n{result.stderr}"
        files[mode] = directory / f"{mode}.yaml"
        files[mode].write_text(result.stdout, encoding="utf-8")
    return files


@pytest.fixture(scope="session")
def terraform_example_reports(tools: Tools) -> dict[str, list[dict]]:
    # Scanned through the examples, so checkov evaluates the module with real inputs; each
    # example in a run of its own.
    return {example.name: checkov(tools, "terraform", example) for example in TERRAFORM_EXAMPLES}


@pytest.fixture(scope="session")
def terraform_reports(terraform_example_reports: dict[str, list[dict]]) -> list[dict]:
    return [report for reports in terraform_example_reports.values() for report in reports]


@pytest.fixture(scope="session")
def bicep_reports(tools: Tools) -> list[dict]:
    return checkov(tools, "bicep", INFRA / "bicep")


@pytest.fixture(scope="session")
def manifest_mode_reports(tools: Tools, rendered_manifests: dict[str, Path]) -> dict[str, list[dict]]:
    return {mode: checkov(tools, "kubernetes", path) for mode, path in rendered_manifests.items()}


@pytest.fixture(scope="session")
def manifest_reports(manifest_mode_reports: dict[str, list[dict]]) -> list[dict]:
    return [report for reports in manifest_mode_reports.values() for report in reports]


@pytest.fixture(scope="session")
def dockerfile_reports(tools: Tools) -> list[dict]:
    return checkov(tools, "dockerfile", REPO / "Dockerfile")


def extract_settings(tools: Tools, language: str, directory: Path) -> dict:
    result = run([tools.python, REPO / "tests" / "infra" / "extract_settings.py", language, directory])
    assert result.returncode == 0, f"extracting {language} settings failed:\n{result.stderr}"
    return json.loads(result.stdout)
