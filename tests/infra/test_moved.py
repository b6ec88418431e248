"""The moved blocks (infra/terraform/main.moved.tf) keep an applied landing zone's diagnostic
settings and private endpoints: each moves an address the configuration no longer declares onto
an instance it makes. One that lands nowhere would have Terraform move the object and then
destroy it, which no plan without Azure credentials shows, so the source is read instead."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.infra.conftest import INFRA, Tools, extract_settings


def _misplaced(moved: list[dict]) -> list[str]:
    return sorted(block["from"] for block in moved if not (block["from_gone"] and block["to_made"]))


def test_every_moved_block_lands_on_an_instance_the_module_makes(tools: Tools) -> None:
    moved = extract_settings(tools, "moved", INFRA / "terraform")["moved"]
    # Thirteen diagnostic settings (ten kinds per stamp, three made once, the opt-in CMK's) and
    # five services' endpoints.
    assert len(moved) == 18
    assert {block["from"].split(".")[0] for block in moved} == {"azurerm_monitor_diagnostic_setting",
                                                                 "azurerm_private_endpoint"}
    assert not _misplaced(moved), _misplaced(moved)


def test_a_renamed_target_or_instance_key_or_a_redeclared_address_is_caught(tools: Tools, tmp_path: Path) -> None:
    module = tmp_path / "terraform"
    shutil.copytree(INFRA / "terraform", module, ignore=shutil.ignore_patterns("examples", ".terraform*"))
    path = module / "main.monitoring.tf"
    text = path.read_text(encoding="utf-8")
    for old, new in (
        ("    hub_vnet = {\n", "    hub_network = {\n"),
        ("ids = { platform = azurerm_cdn_frontdoor_profile.this.id }",
         "ids = { profile = azurerm_cdn_frontdoor_profile.this.id }"),
    ):
        assert old in text
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
    # An old address declared again: its state would be moved away from it.
    with (module / "main.redis.tf").open("a", encoding="utf-8") as handle:
        handle.write('\nresource "azurerm_private_endpoint" "redis" {\n}\n')
    moved = extract_settings(tools, "moved", module)["moved"]
    assert _misplaced(moved) == [
        "azurerm_monitor_diagnostic_setting.front_door",
        "azurerm_monitor_diagnostic_setting.hub_vnet",
        "azurerm_private_endpoint.redis",
    ]
