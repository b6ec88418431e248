"""Reads the landing zone's security settings out of the Terraform or the Bicep source.

Run with the infra tools' interpreter (python-hcl2 and pycep-parser live in .venv-infra, not in
the project's environment):

    .venv-infra/bin/python tests/infra/extract_settings.py terraform infra/terraform
    .venv-infra/bin/python tests/infra/extract_settings.py bicep infra/bicep
    .venv-infra/bin/python tests/infra/extract_settings.py examples infra/terraform
    .venv-infra/bin/python tests/infra/extract_settings.py grafana infra/terraform
    .venv-infra/bin/python tests/infra/extract_settings.py moved infra/terraform

It prints one JSON document with the same keys for both languages, so a test can compare them
setting by setting. Each extractor knows its language's attribute names and nothing else; a
setting that cannot be found comes out as null, which never equals the other side's value.
`examples` lists each Terraform example's stamps and the resources made once per stamp;
`grafana` the dashboard the Terraform writes into Managed Grafana (the Bicep cannot: see
docs/deploy.md), so it is not part of the comparison; `moved` each moved block and whether it
lands on an instance the configuration makes.
Exit status 2 on a parse error (the message names the file).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
INTERPOLATION = re.compile(r"\$\{[^}]*\}")

# Built-in role definitions the landing zone assigns, by ID (Bicep names roles by ID).
ROLE_NAMES = {
    "4d97b98b-1d4f-4787-a291-c67834d212e7": "Network Contributor",
    "b12aa53e-6015-4669-85d0-8515ebb3ae7f": "Private DNS Zone Contributor",
    "4633458b-17de-408a-b874-0445c86b69e6": "Key Vault Secrets User",
    "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1": "Storage Blob Data Reader",
    "b1ff04bb-8a4e-4dc4-8eb5-8693973ce19b": "Azure Kubernetes Service RBAC Cluster Admin",
    "7f951dda-4ed3-4680-a7ca-43fe172d538d": "AcrPull",
    "b0d8363b-8ddd-447d-831f-62ca05bff136": "Monitoring Data Reader",
    "43d0d8ad-25c7-4714-9337-8ba259a9fe05": "Monitoring Reader",
    "22926164-76b3-42b3-bc55-97df8dab3e41": "Grafana Admin",
    "e147488a-f6f5-4113-8e2d-b22465e65bf6": "Key Vault Crypto Service Encryption User",
}

# What a diagnostic setting is attached to, in both languages' words.
TERRAFORM_KINDS = {
    "azurerm_kubernetes_cluster": "aks",
    "azurerm_key_vault": "key_vault",
    "azurerm_managed_redis": "redis",
    "azurerm_firewall": "firewall",
    "azurerm_public_ip": "public_ip",
    "azurerm_virtual_network": "virtual_network",
    "azurerm_network_security_group": "network_security_group",
    "azurerm_cdn_frontdoor_profile": "front_door",
    "azurerm_log_analytics_workspace": "log_analytics",
    "azurerm_storage_account": "storage_blob",
    "azurerm_container_registry": "container_registry",
}
BICEP_KINDS = {
    "Microsoft.ContainerService/managedClusters": "aks",
    "Microsoft.KeyVault/vaults": "key_vault",
    "Microsoft.Cache/redisEnterprise": "redis",
    "Microsoft.Network/azureFirewalls": "firewall",
    "Microsoft.Network/publicIPAddresses": "public_ip",
    "Microsoft.Network/virtualNetworks": "virtual_network",
    "Microsoft.Network/networkSecurityGroups": "network_security_group",
    "Microsoft.Cdn/profiles": "front_door",
    "Microsoft.OperationalInsights/workspaces": "log_analytics",
    "Microsoft.Storage/storageAccounts/blobServices": "storage_blob",
    "Microsoft.ContainerRegistry/registries": "container_registry",
}


def template(text: str) -> str:
    """A string with every interpolation replaced by {} (`a-${x}-b` -> `a-{}-b`)."""
    return INTERPOLATION.sub("{}", text)


def as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


# ------------------------------------------------------------------------------------------
# Terraform (python-hcl2)
# ------------------------------------------------------------------------------------------


def _unquote(value: Any) -> Any:
    """python-hcl2 keeps string literals quoted ('"Deny"'); expressions come as '${...}'."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    if isinstance(value, list):
        return [_unquote(item) for item in value]
    if isinstance(value, dict):
        return {_unquote(key): _unquote(item) for key, item in value.items() if key != "__is_block__"}
    return value


class Terraform:
    def __init__(self, root: Path) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / ".venv-infra" / "python-hcl2"))
        import hcl2  # lives in .venv-infra only

        self.resources: dict[str, dict[str, dict]] = {}
        self.locals: dict[str, Any] = {}
        self.variables: dict[str, dict] = {}
        self.modules: dict[str, dict] = {}
        self.providers: dict[str, dict] = {}
        self.required_providers: dict[str, dict] = {}
        self.moved: list[dict] = []
        for path in sorted(root.glob("*.tf")):
            try:
                with path.open(encoding="utf-8") as handle:
                    document = _unquote(hcl2.load(handle))
            except Exception as exc:  # noqa: BLE001 - any parse failure is reported the same way
                raise SystemExit(f"cannot parse {path}: {exc}") from None
            for block in document.get("resource", []):
                for kind, named in block.items():
                    self.resources.setdefault(kind, {}).update(named)
            for block in document.get("locals", []):
                self.locals.update(block)
            for block in document.get("variable", []):
                self.variables.update(block)
            for block in document.get("module", []):
                self.modules.update(block)
            for block in document.get("provider", []):
                self.providers.update(block)
            self.moved += document.get("moved", [])
            for block in document.get("terraform", []):
                for required in block.get("required_providers", []):
                    self.required_providers.update(required)

    def one(self, kind: str, name: str = "this") -> dict:
        return self.resources.get(kind, {}).get(name, {})

    def all(self, kind: str) -> list[dict]:
        return list(self.resources.get(kind, {}).values())

    def resolve(self, value: Any) -> Any:
        """`${var.x}` -> the variable's default; `${local.x}` -> the local; else unchanged."""
        if isinstance(value, str):
            match = re.fullmatch(r"\$\{var\.(\w+)\}", value)
            if match:
                return self.variables.get(match.group(1), {}).get("default")
            match = re.fullmatch(r"\$\{local\.([\w.]+)\}", value)
            if match:
                node: Any = self.locals
                for part in match.group(1).split("."):
                    node = node.get(part) if isinstance(node, dict) else None
                return self.resolve(node)
        return value


def _block(body: dict, name: str) -> dict:
    value = body.get(name)
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return value[0]
    return {}


def _alerts(rules: Any, severities: Any) -> list | None:
    """Prometheus alert rules as [alert, expression, severity on Azure's scale]; None when the
    rules could not be read."""
    if not isinstance(rules, list):
        return None
    severities = severities if isinstance(severities, dict) else {}
    return sorted(
        [rule.get("alert"), rule.get("expr"), severities.get((rule.get("labels") or {}).get("severity"))]
        for rule in rules
    )


def _rules_file(path: Path) -> list | None:
    """The first group's rules of a Prometheus rules file (the chart's alerts.yaml)."""
    import yaml  # lives in .venv-infra only (checkov needs it)

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))["groups"][0]["rules"]
    except (OSError, KeyError, IndexError, TypeError):
        return None


TERRAFORM_RULES = re.compile(r'\$\{yamldecode\(file\("\$\{path\.module\}/([^"]+)"\)\)\.groups\[0\]\.rules\}')


def _terraform_rules(root: Path, value: Any) -> list | None:
    """`yamldecode(file("${path.module}/FILE")).groups[0].rules`: the rules in FILE."""
    match = TERRAFORM_RULES.fullmatch(str(value))
    return _rules_file(root / match.group(1)) if match else None


def _bicep_rules(module_dir: Path, value: Any) -> list | None:
    """`loadYamlContent('FILE', '$.groups[0].rules')`: the rules in FILE."""
    call = _dig(value, "function")
    if not isinstance(call, dict) or call.get("type") != "load_yaml_content":
        return None
    if call["parameters"].get("path_filter") != "$.groups[0].rules":
        return None
    return _rules_file(module_dir / call["parameters"]["file_path"])


REDIS_ALIAS = re.compile(r"Microsoft\.Cache/redisEnterprise[\w/.]*")


def _optional_default(type_expression: str, attribute: str) -> str | None:
    match = re.search(rf'{attribute}\s*=\s*optional\((?:string|number),\s*\\?"?([^,)"\\]+)', type_expression)
    return match.group(1) if match else None


def _waits_for(tf: Terraform, address: str, kind: str) -> bool:
    """`address` is created after every `kind` resource (or after module `kind`): through
    depends_on, its own or that of what it depends on, or a reference to one in its arguments."""
    seen, pending = set(), [address]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        body = tf.one(*current.split(".", 1))
        if f"{kind}." in json.dumps({key: value for key, value in body.items() if key != "depends_on"}):
            return True
        pending += [str(dependency).strip("${}") for dependency in body.get("depends_on", [])]
    return any(kind in (current, current.split(".", 1)[0]) for current in seen)


def _only_with(count: Any, collection: Any) -> bool:
    """`count = length(C) > 0 ? 1 : 0` for the same C that `collection` (a for_each) names."""
    match = re.fullmatch(r"\$\{length\((.+)\) > 0 \? 1 : 0\}", str(count))
    return bool(match) and f"${{{match.group(1)}}}" == collection


def _terraform_diagnostics(tf: Terraform) -> list | None:
    """[kind, log category groups, metrics] for each local.diagnostic_targets entry (what is not
    set comes from local.diagnostic_defaults, as the module call says); None unless the
    diagnostic-setting module is called once per entry."""
    call = tf.modules.get("diagnostic_setting", {})
    if call.get("for_each") != "${local.diagnostic_targets}":
        return None
    defaults = tf.locals.get("diagnostic_defaults") or {}
    settings = []
    for target in (tf.locals.get("diagnostic_targets") or {}).values():
        kind = re.search(r"(azurerm_[a-z_]+)\.", json.dumps(target.get("ids")))
        logs = target.get("log_groups", defaults.get("log_groups"))
        metrics = target.get("metrics", defaults.get("metrics"))
        settings.append([TERRAFORM_KINDS.get(kind.group(1)) if kind else None, sorted(logs), sorted(metrics)])
    return sorted(settings, key=json.dumps)


def _terraform_endpoints(tf: Terraform) -> set[str]:
    """The resources (`kind.name`) that local.private_endpoints gives an endpoint in every stamp:
    a per-stamp resource's instance of the same key, or a resource made once, and the
    private-endpoint module is called once per entry with an endpoint per stamp."""
    call = tf.modules.get("private_endpoint", {})
    endpoints = str(call.get("endpoints"))
    if call.get("for_each") != "${local.private_endpoints}" or not (
        endpoints.startswith("${{for key, stamp in var.stamps : key => {")
        and "resource_id = each.value.ids[key]" in endpoints
    ):
        return set()
    per_stamp = re.compile(r"\$\{\{for key, (\w+) in (azurerm_\w+\.\w+) : key => \1\.id\}\}")
    shared = re.compile(r"\$\{\{for key in keys\(var\.stamps\) : key => (azurerm_\w+\.\w+)\.id\}\}")
    found = set()
    for service in (tf.locals.get("private_endpoints") or {}).values():
        match = per_stamp.fullmatch(str(service.get("ids"))) or shared.fullmatch(str(service.get("ids")))
        if match:
            found.add(match.group(match.lastindex))
    return found


def extract_terraform(root: Path) -> dict[str, Any]:
    tf = Terraform(root)

    vault = tf.one("azurerm_key_vault")
    redis = tf.one("azurerm_managed_redis")
    database = _block(redis, "default_database")
    aks = tf.one("azurerm_kubernetes_cluster")
    aad = _block(aks, "azure_active_directory_role_based_access_control")
    network = _block(aks, "network_profile")
    system_pool = _block(aks, "default_node_pool")
    gpu_pool = tf.one("azurerm_kubernetes_cluster_node_pool", "gpu")
    waf = tf.one("azurerm_cdn_frontdoor_firewall_policy")
    profile = tf.one("azurerm_cdn_frontdoor_profile")
    origin_group = tf.one("azurerm_cdn_frontdoor_origin_group")
    origin = tf.one("azurerm_cdn_frontdoor_origin", "stamp")
    route = tf.one("azurerm_cdn_frontdoor_route")
    firewall_policy = tf.one("azurerm_firewall_policy")
    firewall = tf.one("azurerm_firewall")
    routes = tf.one("azurerm_route_table", "egress")
    storage = tf.one("azurerm_storage_account", "bundles")
    workspace = tf.one("azurerm_log_analytics_workspace")
    credential = tf.one("azurerm_federated_identity_credential", "gateway")
    registry = tf.one("azurerm_container_registry")
    app_routing = _block(aks, "web_app_routing")

    definitions = tf.locals.get("policy_definitions", {})
    assigned = []
    for assignment in tf.all("azurerm_subscription_policy_assignment"):
        definition = tf.resolve(assignment.get("policy_definition_id"))
        assigned.extend(GUID.findall(str(definition)))

    endpoints = _terraform_endpoints(tf)
    endpoint_groups = [service["subresource"] for service in (tf.locals.get("private_endpoints") or {}).values()]
    for endpoint in tf.all("azurerm_private_endpoint"):
        endpoint_groups.extend(_block(endpoint, "private_service_connection").get("subresource_names", []))

    zones = [template(zone) for zone in tf.locals.get("private_dns_zones", [{}])[0].values()] if isinstance(
        tf.locals.get("private_dns_zones"), list
    ) else []
    zones += [
        template(zone)
        for zone in re.findall(r"privatelink\.[\w.${}\-]+", json.dumps(tf.locals.get("private_dns_zones")))
    ]

    account = tf.variables.get("gateway_service_account", {}).get("type", "")
    gpu_type = tf.variables.get("gpu_node_pool", {}).get("type", "")
    subject = tf.resolve("${local.gateway_subject}")

    rule_sets = sorted(
        [rule.get("type"), rule.get("version"), rule.get("action")] for rule in waf.get("managed_rule", [])
    )
    waf_exclusions = sorted(
        [rule.get("type"), exclusion.get("match_variable"), exclusion.get("operator"), exclusion.get("selector")]
        for rule in waf.get("managed_rule", [])
        for exclusion in rule.get("exclusion", [])
    )

    return {
        "key_vault": {
            "rbac_authorization": vault.get("rbac_authorization_enabled"),
            "purge_protection": vault.get("purge_protection_enabled"),
            "soft_delete_retention_days": vault.get("soft_delete_retention_days"),
            "public_network_access": vault.get("public_network_access_enabled"),
            "network_default_action": _block(vault, "network_acls").get("default_action"),
            "network_bypass": _block(vault, "network_acls").get("bypass"),
            "sku": vault.get("sku_name"),
            "private_endpoint_per_vault": (
                vault.get("for_each") == "${var.stamps}" and "azurerm_key_vault.this" in endpoints
            ),
        },
        "redis": {
            "access_keys_authentication": database.get("access_keys_authentication_enabled"),
            "entra_access_policy_assignments": len(tf.all("azurerm_managed_redis_access_policy_assignment")),
            "tls_only": database.get("client_protocol") == "Encrypted",
            "public_network_access": redis.get("public_network_access") != "Disabled",
            "high_availability": redis.get("high_availability_enabled"),
            "clustering_policy": database.get("clustering_policy"),
            "eviction_policy": database.get("eviction_policy"),
            "sku": redis.get("sku_name"),
        },
        "aks": {
            "local_accounts_disabled": aks.get("local_account_disabled"),
            "entra_azure_rbac": as_bool(aad.get("azure_rbac_enabled")),
            "kubernetes_rbac": aks.get("role_based_access_control_enabled"),
            "workload_identity": aks.get("workload_identity_enabled"),
            "oidc_issuer": aks.get("oidc_issuer_enabled"),
            "azure_policy": aks.get("azure_policy_enabled"),
            "private_cluster_by_default": tf.resolve(aks.get("private_cluster_enabled")),
            "private_cluster_public_fqdn": aks.get("private_cluster_public_fqdn_enabled"),
            "defender": bool(_block(aks, "microsoft_defender")),
            "container_insights_with_entra": as_bool(_block(aks, "oms_agent").get("msi_auth_for_monitoring_enabled")),
            "managed_prometheus": "monitor_metrics" in aks,
            "secret_store_rotation": as_bool(_block(aks, "key_vault_secrets_provider").get("secret_rotation_enabled")),
            "image_cleaner": aks.get("image_cleaner_enabled"),
            "web_app_routing": bool(app_routing),
            "web_app_routing_nginx": app_routing.get("default_nginx_controller"),
            "web_app_routing_dns_zones": app_routing.get("dns_zone_ids"),
            "sku_tier": aks.get("sku_tier"),
            "upgrade_channel": aks.get("automatic_upgrade_channel"),
            "node_os_upgrade_channel": aks.get("node_os_upgrade_channel"),
            "network_plugin": network.get("network_plugin"),
            "network_plugin_mode": network.get("network_plugin_mode"),
            "network_dataplane": network.get("network_data_plane"),
            "network_policy": network.get("network_policy"),
            "outbound_type": network.get("outbound_type"),
            "pod_cidr": network.get("pod_cidr"),
            "service_cidr": network.get("service_cidr"),
            "system_pool": {
                "critical_addons_only": system_pool.get("only_critical_addons_enabled"),
                "os_disk_type": system_pool.get("os_disk_type"),
                "host_encryption": system_pool.get("host_encryption_enabled"),
                "max_pods": system_pool.get("max_pods"),
                "autoscaling": system_pool.get("auto_scaling_enabled"),
                "zones": system_pool.get("zones"),
            },
            "gpu_pool": {
                "mode": gpu_pool.get("mode"),
                "taints": gpu_pool.get("node_taints"),
                "labels": gpu_pool.get("node_labels"),
                "os_disk_type": gpu_pool.get("os_disk_type"),
                "os_disk_size_gb": _optional_default(gpu_type, "os_disk_size_gb")
                if gpu_pool.get("os_disk_size_gb") == "${var.gpu_node_pool.os_disk_size_gb}"
                else gpu_pool.get("os_disk_size_gb"),
                "host_encryption": gpu_pool.get("host_encryption_enabled"),
                "max_pods": gpu_pool.get("max_pods"),
                "autoscaling": gpu_pool.get("auto_scaling_enabled"),
                "mig_profile_from_input": "gpu_instance" in str(gpu_pool.get("gpu_instance")),
                "gpu_driver": gpu_pool.get("gpu_driver"),
            },
        },
        "waf": {
            "enabled": waf.get("enabled"),
            "mode": waf.get("mode"),
            "request_body_check": waf.get("request_body_check_enabled"),
            "managed_rule_sets": rule_sets,
            "body_exclusions": waf_exclusions,
            "sku": waf.get("sku_name"),
        },
        "container_registry": {
            "sku": registry.get("sku"),
            "admin_user": registry.get("admin_enabled"),
            "anonymous_pull": registry.get("anonymous_pull_enabled"),
            "public_network_access": registry.get("public_network_access_enabled"),
            "trusted_services_bypass": registry.get("network_rule_bypass_option"),
            "zone_redundancy": registry.get("zone_redundancy_enabled"),
            "dedicated_data_endpoints": registry.get("data_endpoint_enabled"),
            "export_policy": registry.get("export_policy_enabled"),
            "retention_days": registry.get("retention_policy_in_days"),
        },
        "front_door": {
            "sku": profile.get("sku_name"),
            "origin_over_private_link": bool(_block(origin, "private_link")),
            "origin_certificate_name_check": origin.get("certificate_name_check_enabled"),
            "health_probe": [_block(origin_group, "health_probe").get(key) for key in ("path", "protocol")],
            "forwarding_protocol": route.get("forwarding_protocol"),
            "supported_protocols": route.get("supported_protocols"),
        },
        "firewall": {
            "sku_tier": firewall.get("sku_tier"),
            "policy_sku": firewall_policy.get("sku"),
            "threat_intel_mode": firewall_policy.get("threat_intelligence_mode"),
            "idps_mode": _block(firewall_policy, "intrusion_detection").get("mode"),
            "dns_proxy": _block(firewall_policy, "dns").get("proxy_enabled"),
            "default_route_next_hop": _block(routes, "route").get("next_hop_type"),
            "default_route_prefix": _block(routes, "route").get("address_prefix"),
        },
        "bundle_storage": {
            "shared_key_access": storage.get("shared_access_key_enabled"),
            "public_network_access": storage.get("public_network_access_enabled"),
            "public_blobs": storage.get("allow_nested_items_to_be_public"),
            "min_tls": storage.get("min_tls_version"),
            "replication": storage.get("account_replication_type"),
            "infrastructure_encryption": storage.get("infrastructure_encryption_enabled"),
            "private_endpoint_per_spoke": "azurerm_storage_account.bundles" in endpoints,
        },
        "log_analytics": {
            "local_auth": workspace.get("local_authentication_enabled"),
        },
        "private_endpoint_groups": sorted(endpoint_groups),
        "private_dns_zones": sorted(set(zones)),
        "diagnostic_settings": _terraform_diagnostics(tf),
        "policy_assignments": sorted(assigned),
        "policy_definition_ids": sorted(GUID.findall(json.dumps(definitions))),
        "required_tags": sorted(tf.locals.get("required_tags", [])),
        "kubernetes_policies": {
            "definition_ids": sorted(GUID.findall(json.dumps(tf.locals.get("kubernetes_policy_definitions")))),
            "assignments": len(tf.all("azurerm_resource_policy_assignment")),
            "effect_default": tf.variables.get("kubernetes_policy_effect", {}).get("default"),
        },
        "deny_policy_definition_ids": sorted(GUID.findall(json.dumps(tf.locals.get("deny_policy_definitions")))),
        "managed_redis_deny_fields": sorted(
            set(REDIS_ALIAS.findall(json.dumps(tf.locals.get("managed_redis_deny_rules"))))
        ),
        "defender_plans": sorted(
            plan.get("resource_type") for plan in tf.all("azurerm_security_center_subscription_pricing")
        ),
        "stamp_private_dns_zones": sorted((tf.locals.get("stamp_private_dns_zones") or {}).values()),
        "data_collection_rules": sorted(
            [_block(rule, "data_flow").get("streams"), "azurerm_resource_group.this" in str(rule.get("location"))]
            for rule in tf.all("azurerm_monitor_data_collection_rule")
        ),
        "prometheus_alerts": _alerts(
            _terraform_rules(root, tf.locals.get("prometheus_alerts")), tf.locals.get("prometheus_alert_severity")
        ),
        "role_assignments": sorted(
            assignment.get("role_definition_name") for assignment in tf.all("azurerm_role_assignment")
        ),
        "conditions_and_order": {
            "private_dns_links_before_aks": _waits_for(
                tf, "azurerm_kubernetes_cluster.this", "azurerm_private_dns_zone_virtual_network_link"
            ),
            "front_door_route_only_with_origins": _only_with(route.get("count"), origin.get("for_each")),
        },
        "workload_identity": {
            "audience": credential.get("audience"),
            "subject": template(str(subject)),
            "service_account": [_optional_default(account, "namespace"), _optional_default(account, "name")],
        },
    }


def extract_examples(root: Path) -> dict[str, Any]:
    """The module's resources made once per stamp and those made once in all, and each example's
    stamp keys: what a scan through an example must have seen
    (`module.tenantgate.<kind>.<name>["<stamp>"]`, `module.tenantgate.<kind>.<name>`)."""
    tf = Terraform(root)
    bodies = {f"{kind}.{name}": body for kind, named in tf.resources.items() for name, body in named.items()}
    per_stamp = [address for address, body in bodies.items() if body.get("for_each") == "${var.stamps}"]
    once = [address for address, body in bodies.items() if "for_each" not in body and "count" not in body]
    examples = {}
    for example in sorted(path for path in (root / "examples").iterdir() if path.is_dir()):
        examples[example.name] = sorted(Terraform(example).modules.get("tenantgate", {}).get("stamps", {}))
    return {"per_stamp_resources": sorted(per_stamp), "single_resources": sorted(once), "examples": examples}


MOVED_INTO_MODULE = re.compile(r'module\.(\w+)\["(\w+)"\]\.\w+\.this(\["(\w+)"\])?')


def _keyed_like(tf: Terraform, ids: Any, key: str | None) -> bool:
    """An entry's instances (`ids`) have instance key `key`, or with none, the stamp keys: a
    per-stamp resource's, or one entry per stamp."""
    if key:
        return key in ids if isinstance(ids, dict) else f'"{key}" =>' in str(ids)
    per_stamp = re.fullmatch(r"\$\{\{for key, (\w+) in (\w+)\.(\w+) : key => \1\.id\}\}", str(ids))
    if per_stamp:
        return tf.one(per_stamp.group(2), per_stamp.group(3)).get("for_each") == "${var.stamps}"
    return str(ids).startswith("${{for key in keys(var.stamps) : key => ")


def extract_moved(root: Path) -> dict[str, Any]:
    """Each moved block (main.moved.tf) with whether its `from` is gone from the configuration and
    its `to` is an instance the configuration makes: a module call's entry, keyed as the block
    says. A `to` that is not would have the moved object destroyed on the next apply."""
    tf = Terraform(root)
    declared = {f"{kind}.{name}" for kind, named in tf.resources.items() for name in named}
    blocks = []
    for block in tf.moved:
        source, target = str(block.get("from")).strip("${}"), str(block.get("to")).strip("${}")
        into = MOVED_INTO_MODULE.fullmatch(target)
        entries = tf.resolve(tf.modules.get(into.group(1), {}).get("for_each")) if into else None
        entry = entries.get(into.group(2)) if isinstance(entries, dict) else None
        blocks.append({
            "from": source,
            "to": target,
            "from_gone": re.sub(r"\[.*", "", source) not in declared,
            "to_made": isinstance(entry, dict) and _keyed_like(tf, entry.get("ids"), into.group(4)),
        })
    return {"moved": blocks}


TERRAFORM_FILE = re.compile(r'\$\{file\("\$\{path\.module\}/([^"]+)"\)\}')


def extract_grafana(root: Path) -> dict[str, Any]:
    """The dashboard the module writes into Managed Grafana (grafana_dashboard_enabled): the file
    it reads, relative to the repository, its folder, whether it is on by default, whether it
    waits for Grafana's private endpoints; and the grafana provider each example configures."""
    tf = Terraform(root)
    folder = tf.one("grafana_folder", "tenantgate")
    dashboard = tf.one("grafana_dashboard", "tenantgate")
    source = TERRAFORM_FILE.fullmatch(str(dashboard.get("config_json")))
    repository = Path(__file__).resolve().parents[2]
    enabled = "${var.grafana_dashboard_enabled ? 1 : 0}"
    examples = {}
    for example in sorted(path for path in (root / "examples").iterdir() if path.is_dir()):
        configured = Terraform(example)
        examples[example.name] = {
            "provider": configured.required_providers.get("grafana"),
            "url": configured.providers.get("grafana", {}).get("url"),
            # The token comes from GRAFANA_AUTH, never from the configuration.
            "auth_in_configuration": "auth" in configured.providers.get("grafana", {}),
            "enabled": configured.modules.get("tenantgate", {}).get("grafana_dashboard_enabled"),
        }
    return {
        "dashboard_file": str((root / source.group(1)).resolve().relative_to(repository)) if source else None,
        "folder": [folder.get("uid"), folder.get("title")],
        "dashboard_in_folder": dashboard.get("folder") == "${grafana_folder.tenantgate[0].uid}",
        "overwrite": dashboard.get("overwrite"),
        "only_when_enabled": folder.get("count") == dashboard.get("count") == enabled,
        "enabled_by_default": tf.variables.get("grafana_dashboard_enabled", {}).get("default"),
        "waits_for_private_endpoints": _waits_for(tf, "grafana_folder.tenantgate", "module.private_endpoint")
        and "azurerm_dashboard_grafana.this" in _terraform_endpoints(tf),
        "provider": tf.required_providers.get("grafana"),
        "examples": examples,
    }


# ------------------------------------------------------------------------------------------
# Bicep (pycep-parser, the parser checkov uses)
# ------------------------------------------------------------------------------------------


def _body(resource: dict) -> dict:
    """A resource's config, unwrapped from loops and conditions."""
    config = resource.get("config", {})
    while isinstance(config, dict) and ("loop_type" in config or "condition" in config) and "config" in config:
        config = config["config"]
    return config


def _dig(node: Any, *path: str) -> Any:
    for key in path:
        if isinstance(node, list) and isinstance(key, int):
            node = node[key] if len(node) > key else None
        elif isinstance(node, dict):
            node = node.get(key)
        else:
            return None
    return node


class Bicep:
    def __init__(self, root: Path) -> None:
        from pycep import BicepParser  # lives in .venv-infra only

        parser = BicepParser()
        self.files: dict[str, dict] = {}
        for path in sorted(root.rglob("*.bicep")):
            try:
                self.files[path.name] = parser.parse(file_path=path)
            except Exception as exc:  # noqa: BLE001 - any parse failure is reported the same way
                raise SystemExit(f"cannot parse {path}: {exc}") from None

    def resources(self, kind: str) -> list[tuple[str, dict, dict]]:
        """(file name, symbolic name -> resource map of that file, resource) for every `kind`."""
        found = []
        for name, document in self.files.items():
            for resource in document.get("resources", {}).values():
                # `existing` resources are references to what another file deploys.
                if resource.get("type") == kind and not resource.get("existing"):
                    found.append((name, document.get("resources", {}), resource))
        return found

    def one(self, kind: str) -> dict:
        matches = self.resources(kind)
        return _body(matches[0][2]) if matches else {}

    def variable(self, file_name: str, name: str) -> Any:
        return _dig(self.files.get(file_name, {}), "variables", name, "value")

    def parameter_default(self, name: str) -> Any:
        return _dig(self.files.get("main.bicep", {}), "parameters", name, "default")


def _in_loop(bicep: Bicep, file_name: str, value: Any, item_name: str | None, item: Any) -> Any:
    """`value` for one item of a loop: `item.field` is the item's field, `V[item.field]` that
    entry of the file's variable V; anything else as it is."""
    operator = _dig(value, "operator") or {}
    operands = operator.get("operands") or {}
    if operator.get("type") == "property_accessor" and item_name and operands.get("operand_1") == item_name:
        return item.get(operands.get("operand_2")) if isinstance(item, dict) else None
    if operator.get("type") == "index_accessor":
        key = _in_loop(bicep, file_name, operands.get("operand_2"), item_name, item)
        return _dig(bicep.variable(file_name, operands.get("operand_1")), key) if isinstance(key, str) else None
    return value


def _resolve(bicep: Bicep, file_name: str, value: Any) -> tuple[str, str] | None:
    """The resource (its file name, its type) an ID in `file_name` names: `symbol.id`, a
    module's output, or a parameter that the file's callers pass in."""
    document = bicep.files.get(file_name, {})
    operands = _dig(value, "operator", "operands") or {}
    symbol, member = operands.get("operand_1"), operands.get("operand_2")
    if member == "id" and symbol in document.get("resources", {}):
        return file_name, document["resources"][symbol].get("type")
    output = _dig(member, "operator", "operands") or {}
    if symbol in document.get("modules", {}) and output.get("operand_1") == "outputs":
        child = Path(_dig(document["modules"][symbol], "detail", "path") or "").name
        return _resolve(bicep, child, _dig(bicep.files.get(child, {}), "outputs", output.get("operand_2"), "value"))
    if isinstance(value, str) and value in document.get("parameters", {}):
        for parent, caller in bicep.files.items():
            for module in caller.get("modules", {}).values():
                if Path(_dig(module, "detail", "path") or "").name == file_name:
                    found = _resolve(bicep, parent, (_body(module).get("params") or {}).get(value))
                    if found:
                        return found
    return None


def _bicep_endpoints(bicep: Bicep) -> list[tuple[str, Any, tuple[str, str] | None]]:
    """(file, private link group, (file, type) of what it connects to) for every private
    endpoint, once per item of a loop over a variable."""
    found = []
    for file_name, _, endpoint in bicep.resources("Microsoft.Network/privateEndpoints"):
        loop = _dig(endpoint, "config", "loop_type", "detail") or {}
        items = bicep.variable(file_name, loop["array_name"]) if loop.get("array_name") else [None]
        connection = _dig(_body(endpoint), "properties", "privateLinkServiceConnections", 0, "properties") or {}
        for item in items or []:
            group = _in_loop(bicep, file_name, _dig(connection, "groupIds", 0), loop.get("item_name"), item)
            target = _in_loop(bicep, file_name, connection.get("privateLinkServiceId"), loop.get("item_name"), item)
            found.append((file_name, group, _resolve(bicep, file_name, target)))
    return found


def _deploys(bicep: Bicep, file_name: str, kind: str) -> bool:
    """`file_name` deploys a `kind` resource, itself or through its modules."""
    document = bicep.files.get(file_name, {})
    if any(
        resource.get("type") == kind and not resource.get("existing")
        for resource in document.get("resources", {}).values()
    ):
        return True
    return any(
        _deploys(bicep, Path(_dig(module, "detail", "path") or "").name, kind)
        for module in document.get("modules", {}).values()
    )


def _deployed_after(bicep: Bicep, kind: str, first: str) -> bool:
    """Every module that deploys a `kind` resource waits, through dependsOn (its own or that of
    the modules it depends on), for a module that deploys `first`, in the file that holds it or in
    one that holds that file."""
    holders = [
        name
        for name, document in bicep.files.items()
        if any(r.get("type") == kind for r in document.get("resources", {}).values())
    ]
    if not holders:
        return False
    for holder in holders:
        if not _waits_in_parents(bicep, holder, first, set()):
            return False
    return True


def _waits_in_parents(bicep: Bicep, file_name: str, first: str, visited: set[str]) -> bool:
    parents = [
        (name, symbol)
        for name, document in bicep.files.items()
        for symbol, module in document.get("modules", {}).items()
        if Path(_dig(module, "detail", "path") or "").name == file_name
    ]
    if not parents or file_name in visited:
        return False
    visited.add(file_name)
    for parent, symbol in parents:
        modules = bicep.files[parent].get("modules", {})
        seen, pending = set(), [symbol]
        while pending:
            current = pending.pop()
            if current in seen or current not in modules:
                continue
            seen.add(current)
            pending += _body(modules[current]).get("dependsOn") or []
        waited = any(
            _deploys(bicep, Path(_dig(modules[name], "detail", "path") or "").name, first) for name in seen - {symbol}
        )
        if not waited and not _waits_in_parents(bicep, parent, first, visited):
            return False
    return True


def _route_only_with_origins(bicep: Bicep) -> bool:
    """The route's condition is `contains(V, true)`, where V maps the origins' own loop to their
    condition: at least one origin exists."""
    routes = bicep.resources("Microsoft.Cdn/profiles/afdEndpoints/routes")
    origins = bicep.resources("Microsoft.Cdn/profiles/originGroups/origins")
    if not routes or not origins:
        return False
    file_name, _, route = routes[0]
    condition = _dig(route, "config", "condition", "function") or {}
    mapped = bicep.variable(file_name, _dig(condition, "parameters", "container")) or {}
    loop = origins[0][2].get("config", {})
    return (
        condition.get("type") == "contains"
        and _dig(condition, "parameters", "item_to_find") is True
        and mapped.get("loop_type") == loop.get("loop_type")
        and mapped.get("config") == loop.get("condition")
    )


def extract_bicep(root: Path) -> dict[str, Any]:
    bicep = Bicep(root)

    vault = bicep.one("Microsoft.KeyVault/vaults")
    cache = bicep.one("Microsoft.Cache/redisEnterprise")
    database = bicep.one("Microsoft.Cache/redisEnterprise/databases")
    aks = bicep.one("Microsoft.ContainerService/managedClusters")
    gpu_pool = bicep.one("Microsoft.ContainerService/managedClusters/agentPools")
    waf = bicep.one("Microsoft.Network/FrontDoorWebApplicationFirewallPolicies")
    profile = bicep.one("Microsoft.Cdn/profiles")
    origin_group = bicep.one("Microsoft.Cdn/profiles/originGroups")
    origin = bicep.one("Microsoft.Cdn/profiles/originGroups/origins")
    route = bicep.one("Microsoft.Cdn/profiles/afdEndpoints/routes")
    firewall_policy = bicep.one("Microsoft.Network/firewallPolicies")
    firewall = bicep.one("Microsoft.Network/azureFirewalls")
    routes = bicep.one("Microsoft.Network/routeTables")
    storage = bicep.one("Microsoft.Storage/storageAccounts")
    workspace = bicep.one("Microsoft.OperationalInsights/workspaces")
    credential = bicep.one("Microsoft.ManagedIdentity/userAssignedIdentities/federatedIdentityCredentials")
    registry = bicep.one("Microsoft.ContainerRegistry/registries")
    policies = _dig(registry, "properties", "policies") or {}

    properties = aks.get("properties", {})
    system_pool = _dig(properties, "agentPoolProfiles", 0) or {}
    pool = gpu_pool.get("properties", {})
    addons = properties.get("addonProfiles", {})
    network = properties.get("networkProfile", {})

    definitions = bicep.variable("main.bicep", "policyDefinitions") or {}
    assigned = []
    for _, _, assignment in bicep.resources("Microsoft.Authorization/policyAssignments"):
        reference = _dig(_body(assignment), "properties", "policyDefinitionId")
        # `policyDefinitions.x` comes back as a property accessor on the variable.
        key = _dig(reference, "operator", "operands", "operand_2")
        assigned.extend(GUID.findall(str(definitions.get(key, reference))))

    diagnostics = []
    for _, symbols, setting in bicep.resources("Microsoft.Insights/diagnosticSettings"):
        body = _body(setting)
        target = symbols.get(body.get("scope"), {})
        logs = [log.get("categoryGroup") for log in _dig(body, "properties", "logs") or []]
        metrics = [metric.get("category") for metric in _dig(body, "properties", "metrics") or []]
        diagnostics.append([BICEP_KINDS.get(target.get("type")), sorted(logs), sorted(metrics)])

    endpoints = _bicep_endpoints(bicep)
    endpoint_groups = [group for _, group, _ in endpoints]
    # What each stamp (stamp.bicep, deployed once per stamp) has an endpoint to.
    stamp_endpoints = {target for file_name, _, target in endpoints if file_name == "stamp.bicep"}

    zone_sources = json.dumps(
        [
            bicep.variable("main.bicep", "sharedPrivateDnsZoneNames"),
            bicep.variable("main.bicep", "aksPrivateDnsZoneNames"),
        ]
    )
    zones = [template(zone) for zone in re.findall(r"privatelink\.[\w.${}\-]+", zone_sources)]

    roles = []
    for file_name, _, assignment in bicep.resources("Microsoft.Authorization/roleAssignments"):
        reference = _dig(_body(assignment), "properties", "roleDefinitionId")
        for guid in GUID.findall(
            json.dumps(bicep.variable(file_name, reference) if isinstance(reference, str) else reference)
        ):
            roles.append(ROLE_NAMES.get(guid, guid))

    account = bicep.parameter_default("gatewayServiceAccount") or {}
    rule_sets = sorted(
        [rule.get("ruleSetType"), rule.get("ruleSetVersion"), rule.get("ruleSetAction")]
        for rule in _dig(waf, "properties", "managedRules", "managedRuleSets") or []
    )
    private_cluster = _dig(properties, "apiServerAccessProfile", "enablePrivateCluster")
    if isinstance(private_cluster, str):  # a parameter passed down from main.bicep
        private_cluster = bicep.parameter_default(private_cluster)
    waf_exclusions = sorted(
        [
            rule.get("ruleSetType"),
            exclusion.get("matchVariable"),
            exclusion.get("selectorMatchOperator"),
            exclusion.get("selector"),
        ]
        for rule in _dig(waf, "properties", "managedRules", "managedRuleSets") or []
        for exclusion in rule.get("exclusions") or []
    )
    app_routing = _dig(properties, "ingressProfile", "webAppRouting") or {}
    policy_settings = _dig(waf, "properties", "policySettings") or {}
    probe = _dig(origin_group, "properties", "healthProbeSettings") or {}
    route_entry = _dig(routes, "properties", "routes", 0, "properties") or {}

    return {
        "key_vault": {
            "rbac_authorization": _dig(vault, "properties", "enableRbacAuthorization"),
            "purge_protection": _dig(vault, "properties", "enablePurgeProtection"),
            "soft_delete_retention_days": _dig(vault, "properties", "softDeleteRetentionInDays"),
            "public_network_access": _dig(vault, "properties", "publicNetworkAccess") != "Disabled",
            "network_default_action": _dig(vault, "properties", "networkAcls", "defaultAction"),
            "network_bypass": _dig(vault, "properties", "networkAcls", "bypass"),
            "sku": _dig(vault, "properties", "sku", "name"),
            # The stamps' vaults, as the Terraform reads azurerm_key_vault.this (not the opt-in CMK vault).
            "private_endpoint_per_vault": ("key-vault.bicep", "Microsoft.KeyVault/vaults") in stamp_endpoints,
        },
        "redis": {
            "access_keys_authentication": _dig(database, "properties", "accessKeysAuthentication") != "Disabled",
            "entra_access_policy_assignments": len(
                bicep.resources("Microsoft.Cache/redisEnterprise/databases/accessPolicyAssignments")
            ),
            "tls_only": _dig(database, "properties", "clientProtocol") == "Encrypted",
            "public_network_access": _dig(cache, "properties", "publicNetworkAccess") != "Disabled",
            "high_availability": _dig(cache, "properties", "highAvailability") == "Enabled",
            "clustering_policy": _dig(database, "properties", "clusteringPolicy"),
            "eviction_policy": _dig(database, "properties", "evictionPolicy"),
            "sku": _dig(cache, "sku", "name"),
        },
        "aks": {
            "local_accounts_disabled": properties.get("disableLocalAccounts"),
            "entra_azure_rbac": (
                _dig(properties, "aadProfile", "enableAzureRBAC") and _dig(properties, "aadProfile", "managed")
            ),
            "kubernetes_rbac": properties.get("enableRBAC"),
            "workload_identity": _dig(properties, "securityProfile", "workloadIdentity", "enabled"),
            "oidc_issuer": _dig(properties, "oidcIssuerProfile", "enabled"),
            "azure_policy": _dig(addons, "azurepolicy", "enabled"),
            "private_cluster_by_default": private_cluster,
            "private_cluster_public_fqdn": _dig(properties, "apiServerAccessProfile", "enablePrivateClusterPublicFQDN"),
            "defender": bool(_dig(properties, "securityProfile", "defender", "securityMonitoring", "enabled")),
            "container_insights_with_entra": bool(_dig(addons, "omsagent", "enabled"))
            and as_bool(_dig(addons, "omsagent", "config", "useAADAuth")),
            "managed_prometheus": bool(_dig(properties, "azureMonitorProfile", "metrics", "enabled")),
            "secret_store_rotation": as_bool(
                _dig(addons, "azureKeyvaultSecretsProvider", "config", "enableSecretRotation")
            ),
            "image_cleaner": _dig(properties, "securityProfile", "imageCleaner", "enabled"),
            "web_app_routing": app_routing.get("enabled"),
            "web_app_routing_nginx": _dig(app_routing, "nginx", "defaultIngressControllerType"),
            "web_app_routing_dns_zones": app_routing.get("dnsZoneResourceIds"),
            "sku_tier": _dig(aks, "sku", "tier"),
            "upgrade_channel": _dig(properties, "autoUpgradeProfile", "upgradeChannel"),
            "node_os_upgrade_channel": _dig(properties, "autoUpgradeProfile", "nodeOSUpgradeChannel"),
            "network_plugin": network.get("networkPlugin"),
            "network_plugin_mode": network.get("networkPluginMode"),
            "network_dataplane": network.get("networkDataplane"),
            "network_policy": network.get("networkPolicy"),
            "outbound_type": network.get("outboundType"),
            "pod_cidr": network.get("podCidr"),
            "service_cidr": network.get("serviceCidr"),
            "system_pool": {
                "critical_addons_only": "CriticalAddonsOnly=true:NoSchedule" in (system_pool.get("nodeTaints") or []),
                "os_disk_type": system_pool.get("osDiskType"),
                "host_encryption": system_pool.get("enableEncryptionAtHost"),
                "max_pods": system_pool.get("maxPods"),
                "autoscaling": system_pool.get("enableAutoScaling"),
                "zones": system_pool.get("availabilityZones"),
            },
            "gpu_pool": {
                "mode": pool.get("mode"),
                "taints": pool.get("nodeTaints"),
                # pycep keeps the quotes of quoted keys ('tenantgate.io/pool').
                "labels": {key.strip("'"): value for key, value in (pool.get("nodeLabels") or {}).items()},
                "os_disk_type": pool.get("osDiskType"),
                "os_disk_size_gb": str((bicep.parameter_default("gpuNodePool") or {}).get("osDiskSizeGB"))
                if "osDiskSizeGB" in json.dumps(pool.get("osDiskSizeGB"))
                else pool.get("osDiskSizeGB"),
                "host_encryption": pool.get("enableEncryptionAtHost"),
                "max_pods": pool.get("maxPods"),
                "autoscaling": pool.get("enableAutoScaling"),
                "mig_profile_from_input": "gpuInstanceProfile" in json.dumps(pool.get("gpuInstanceProfile")),
                "gpu_driver": _dig(pool, "gpuProfile", "driver"),
            },
        },
        "waf": {
            "enabled": policy_settings.get("enabledState") == "Enabled",
            "mode": policy_settings.get("mode"),
            "request_body_check": policy_settings.get("requestBodyCheck") == "Enabled",
            "managed_rule_sets": rule_sets,
            "body_exclusions": waf_exclusions,
            "sku": _dig(waf, "sku", "name"),
        },
        "container_registry": {
            "sku": _dig(registry, "sku", "name"),
            "admin_user": _dig(registry, "properties", "adminUserEnabled"),
            "anonymous_pull": _dig(registry, "properties", "anonymousPullEnabled"),
            "public_network_access": _dig(registry, "properties", "publicNetworkAccess") != "Disabled",
            "trusted_services_bypass": _dig(registry, "properties", "networkRuleBypassOptions"),
            "zone_redundancy": _dig(registry, "properties", "zoneRedundancy") == "Enabled",
            "dedicated_data_endpoints": _dig(registry, "properties", "dataEndpointEnabled"),
            "export_policy": _dig(policies, "exportPolicy", "status") == "enabled",
            "retention_days": (
                _dig(policies, "retentionPolicy", "days")
                if _dig(policies, "retentionPolicy", "status") == "enabled"
                else None
            ),
        },
        "front_door": {
            "sku": _dig(profile, "sku", "name"),
            "origin_over_private_link": bool(_dig(origin, "properties", "sharedPrivateLinkResource", "privateLink")),
            "origin_certificate_name_check": _dig(origin, "properties", "enforceCertificateNameCheck"),
            "health_probe": [probe.get("probePath"), probe.get("probeProtocol")],
            "forwarding_protocol": _dig(route, "properties", "forwardingProtocol"),
            "supported_protocols": _dig(route, "properties", "supportedProtocols"),
        },
        "firewall": {
            "sku_tier": _dig(firewall, "properties", "sku", "tier"),
            "policy_sku": _dig(firewall_policy, "properties", "sku", "tier"),
            "threat_intel_mode": _dig(firewall_policy, "properties", "threatIntelMode"),
            "idps_mode": _dig(firewall_policy, "properties", "intrusionDetection", "mode"),
            "dns_proxy": _dig(firewall_policy, "properties", "dnsSettings", "enableProxy"),
            "default_route_next_hop": route_entry.get("nextHopType"),
            "default_route_prefix": route_entry.get("addressPrefix"),
        },
        "bundle_storage": {
            "shared_key_access": _dig(storage, "properties", "allowSharedKeyAccess"),
            "public_network_access": _dig(storage, "properties", "publicNetworkAccess") != "Disabled",
            "public_blobs": _dig(storage, "properties", "allowBlobPublicAccess"),
            "min_tls": _dig(storage, "properties", "minimumTlsVersion"),
            "replication": str(_dig(storage, "sku", "name")).removeprefix("Standard_"),
            "infrastructure_encryption": _dig(storage, "properties", "encryption", "requireInfrastructureEncryption"),
            "private_endpoint_per_spoke": ("bundles.bicep", "Microsoft.Storage/storageAccounts") in stamp_endpoints,
        },
        "log_analytics": {
            "local_auth": not _dig(workspace, "properties", "features", "disableLocalAuth"),
        },
        "private_endpoint_groups": sorted(endpoint_groups),
        "private_dns_zones": sorted(set(zones)),
        "diagnostic_settings": sorted(diagnostics, key=json.dumps),
        "policy_assignments": sorted(assigned),
        "policy_definition_ids": sorted(GUID.findall(json.dumps(definitions))),
        "required_tags": sorted(bicep.variable("main.bicep", "requiredTags") or []),
        "kubernetes_policies": {
            "definition_ids": sorted(
                GUID.findall(json.dumps(bicep.variable("aks.bicep", "kubernetesPolicyDefinitions")))
            ),
            "assignments": sum(
                1
                for _, _, assignment in bicep.resources("Microsoft.Authorization/policyAssignments")
                if _body(assignment).get("scope")
            ),
            "effect_default": bicep.parameter_default("kubernetesPolicyEffect"),
        },
        "deny_policy_definition_ids": sorted(
            GUID.findall(json.dumps(bicep.variable("governance.bicep", "denyPolicies")))
        ),
        "managed_redis_deny_fields": sorted(
            set(REDIS_ALIAS.findall(json.dumps(bicep.variable("governance.bicep", "managedRedisDenyRules"))))
        ),
        "defender_plans": sorted(
            _body(plan).get("name") for _, _, plan in bicep.resources("Microsoft.Security/pricings")
        ),
        "stamp_private_dns_zones": sorted(bicep.variable("stamp.bicep", "stampPrivateDnsZoneNames") or []),
        "data_collection_rules": sorted(
            [
                _dig(_body(rule), "properties", "dataFlows", 0, "streams"),
                _body(rule).get("location") == "monitoringLocation",
            ]
            for _, _, rule in bicep.resources("Microsoft.Insights/dataCollectionRules")
        ),
        "prometheus_alerts": _alerts(
            _bicep_rules(root / "modules", bicep.variable("aks.bicep", "prometheusAlerts")),
            bicep.variable("aks.bicep", "prometheusAlertSeverity"),
        ),
        "role_assignments": sorted(roles),
        "conditions_and_order": {
            "private_dns_links_before_aks": _deployed_after(
                bicep,
                "Microsoft.ContainerService/managedClusters",
                "Microsoft.Network/privateDnsZones/virtualNetworkLinks",
            ),
            "front_door_route_only_with_origins": _route_only_with_origins(bicep),
        },
        "workload_identity": {
            "audience": _dig(credential, "properties", "audiences"),
            "subject": template(str(_dig(credential, "properties", "subject"))),
            "service_account": [account.get("namespace"), account.get("name")],
        },
    }


def main(argv: list[str]) -> int:
    extractors = {
        "terraform": extract_terraform,
        "bicep": extract_bicep,
        "examples": extract_examples,
        "grafana": extract_grafana,
        "moved": extract_moved,
    }
    if len(argv) != 3 or argv[1] not in extractors:
        print("usage: extract_settings.py terraform|bicep|examples|grafana|moved DIR", file=sys.stderr)
        return 2
    extract = extractors[argv[1]]
    try:
        settings = extract(Path(argv[2]))
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    print(json.dumps(settings, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
