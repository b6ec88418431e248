"""tflint over the Terraform: the module on its own and through each example (so tflint evaluates
it with the example's inputs), with the bundled terraform ruleset (preset `all`) and the azurerm
ruleset loaded as a plugin from a local directory. Zero issues of any severity, zero errors.

tflint is built with `go install` by scripts/install-infra-tools.sh: missing, it skips here and
fails under TENANTGATE_REQUIRE_TOOLS=1 (as `make test` sets). The azurerm ruleset is not served by
the Go module proxy these machines reach, so the script builds it only from a checkout named by
TFLINT_RULESET_AZURERM_SRC; without one its tests skip, saying why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.infra.conftest import INFRA, TERRAFORM_EXAMPLES, VENV_INFRA, require_go_binary, run

CONFIG = INFRA / "terraform" / ".tflint.hcl"
PLUGIN_DIR = Path(os.environ.get("TFLINT_PLUGIN_DIR") or VENV_INFRA / "tflint-plugins")
AZURERM_RULESET = PLUGIN_DIR / "tflint-ruleset-azurerm"
TARGETS = {"module": INFRA / "terraform", **{f"examples/{example.name}": example for example in TERRAFORM_EXAMPLES}}


@pytest.fixture(scope="module")
def tflint() -> Path:
    return require_go_binary("tflint")


@pytest.fixture(scope="module")
def azurerm_ruleset() -> Path:
    if not os.access(AZURERM_RULESET, os.X_OK):
        pytest.skip(
            f"tflint-ruleset-azurerm is not in {PLUGIN_DIR}: the Go module proxy does not serve it; "
            "run scripts/install-infra-tools.sh with TFLINT_RULESET_AZURERM_SRC set to its checkout"
        )
    return AZURERM_RULESET


def lint(tflint: Path, directory: Path, *extra: str, config: Path = CONFIG) -> list[dict]:
    """tflint's issues in `directory`; any error (a config or a plugin it cannot load) fails."""
    command = [tflint, "--chdir", directory, "--config", config, "--format", "json", *extra]
    result = run(command, env={"TFLINT_PLUGIN_DIR": str(PLUGIN_DIR)})
    # 0: no issues, 2: issues (listed), anything else: tflint itself failed.
    assert result.returncode in (0, 2), f"tflint exited {result.returncode}:\n{result.stdout}{result.stderr}"
    report = json.loads(result.stdout)
    assert not report["errors"], report["errors"]
    return report["issues"]


def _describe(issues: list[dict]) -> str:
    return "\n".join(
        f"  {issue['range']['filename']}:{issue['range']['start']['line']} {issue['rule']['name']}: {issue['message']}"
        for issue in issues
    )


@pytest.mark.parametrize("target", list(TARGETS))
def test_tflint_terraform_ruleset_finds_nothing(tflint: Path, target: str) -> None:
    issues = lint(tflint, TARGETS[target])
    assert not issues, f"tflint in {target}:\n{_describe(issues)}"


@pytest.mark.parametrize("target", list(TARGETS))
def test_tflint_azurerm_ruleset_finds_nothing(tflint: Path, azurerm_ruleset: Path, target: str) -> None:
    issues = lint(tflint, TARGETS[target], "--enable-plugin=azurerm")
    assert not issues, f"tflint (azurerm ruleset) in {target}:\n{_describe(issues)}"


FLAWED_MODULE = """
variable "size" {
  type = string
}

resource "azurerm_kubernetes_cluster_node_pool" "gpu" {
  name                  = "gpu"
  kubernetes_cluster_id = "x"
  vm_size               = "Standard_NC24ads_A100_v9"
}

resource "azurerm_storage_account" "data" {
  name                     = "data"
  resource_group_name      = "rg"
  location                 = "westeurope"
  account_tier             = "Standard"
  account_replication_type = "ZRS"
}
"""


def test_tflint_reports_flaws(tflint: Path, tmp_path: Path) -> None:
    # The config loads the ruleset with its full preset: an undocumented variable is reported.
    (tmp_path / "main.tf").write_text(FLAWED_MODULE, encoding="utf-8")
    rules = {issue["rule"]["name"] for issue in lint(tflint, tmp_path)}
    assert {"terraform_documented_variables", "terraform_required_version",
            "terraform_unused_declarations"} <= rules, rules


def test_tflint_azurerm_ruleset_reports_flaws(tflint: Path, azurerm_ruleset: Path, tmp_path: Path) -> None:
    # A GPU size Azure does not have, and a data account without prevent_destroy.
    (tmp_path / "main.tf").write_text(FLAWED_MODULE, encoding="utf-8")
    rules = {issue["rule"]["name"] for issue in lint(tflint, tmp_path, "--enable-plugin=azurerm")}
    assert {"azurerm_kubernetes_cluster_node_pool_invalid_vm_size",
            "azurerm_resources_missing_prevent_destroy"} <= rules, rules
