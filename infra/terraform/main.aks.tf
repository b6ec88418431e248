# ---------------------------------------------------------------------------------------------
# AKS: Entra ID with Azure RBAC and no local accounts, workload identity (OIDC issuer), Azure
# Policy add-on, Cilium network policy, Defender, Container Insights and managed Prometheus,
# a private API server (or authorized ranges), egress through the hub firewall, the application
# routing add-on as the regional ingress; a system pool and a tainted GPU pool (optionally
# MIG-partitioned).
# ---------------------------------------------------------------------------------------------

resource "azurerm_user_assigned_identity" "aks" {
  for_each = var.stamps

  name                = "id-${var.name}-${each.key}-aks"
  location            = each.value.location
  resource_group_name = azurerm_resource_group.stamp[each.key].name
  tags                = var.tags
}

# A private cluster with our own DNS zone: the control plane identity writes its A record...
resource "azurerm_role_assignment" "aks_private_dns" {
  for_each = local.private_cluster ? var.stamps : {}

  scope                = azurerm_private_dns_zone.this["aks_${each.key}"].id
  role_definition_name = "Private DNS Zone Contributor"
  principal_id         = azurerm_user_assigned_identity.aks[each.key].principal_id
}

# ...and joins nodes and internal load balancers to the spoke.
resource "azurerm_role_assignment" "aks_network" {
  for_each = var.stamps

  scope                = azurerm_virtual_network.spoke[each.key].id
  role_definition_name = "Network Contributor"
  principal_id         = azurerm_user_assigned_identity.aks[each.key].principal_id
}

resource "azurerm_kubernetes_cluster" "this" {
  #checkov:skip=CKV_AZURE_117:OS disks are ephemeral (VM-local, encrypted at host, never persisted) and the chart mounts no persistent volumes, so a disk encryption set would protect nothing
  for_each = var.stamps

  name                = "aks-${var.name}-${each.key}"
  location            = each.value.location
  resource_group_name = azurerm_resource_group.stamp[each.key].name
  node_resource_group = "rg-${var.name}-${each.key}-nodes"
  dns_prefix          = "${var.name}-${each.key}"
  sku_tier            = "Standard"
  tags                = var.tags

  automatic_upgrade_channel = "patch"
  node_os_upgrade_channel   = "NodeImage"

  # Upgrades roll nodes only inside these windows (node images and Kubernetes patches on
  # different days, so a node never goes through both at once).
  maintenance_window_auto_upgrade {
    frequency   = "Weekly"
    interval    = 1
    day_of_week = var.maintenance_windows.auto_upgrade.day_of_week
    start_time  = var.maintenance_windows.auto_upgrade.start_time
    utc_offset  = var.maintenance_windows.auto_upgrade.utc_offset
    duration    = var.maintenance_windows.auto_upgrade.duration_hours
  }
  maintenance_window_node_os {
    frequency   = "Weekly"
    interval    = 1
    day_of_week = var.maintenance_windows.node_os.day_of_week
    start_time  = var.maintenance_windows.node_os.start_time
    utc_offset  = var.maintenance_windows.node_os.utc_offset
    duration    = var.maintenance_windows.node_os.duration_hours
  }

  # Identity: Entra ID users through Azure RBAC only; pods through workload identity.
  local_account_disabled            = true
  role_based_access_control_enabled = true
  oidc_issuer_enabled               = true
  workload_identity_enabled         = true
  azure_active_directory_role_based_access_control {
    azure_rbac_enabled     = true
    tenant_id              = data.azurerm_client_config.current.tenant_id
    admin_group_object_ids = var.aks_admin_group_object_ids
  }

  # API server: private by default, or public behind authorized ranges.
  private_cluster_enabled             = var.private_cluster_enabled
  private_dns_zone_id                 = local.private_cluster ? azurerm_private_dns_zone.this["aks_${each.key}"].id : null
  private_cluster_public_fqdn_enabled = false
  dynamic "api_server_access_profile" {
    for_each = var.private_cluster_enabled ? [] : [1]
    content {
      authorized_ip_ranges = var.api_server_authorized_ip_ranges
    }
  }

  azure_policy_enabled         = true
  image_cleaner_enabled        = true
  image_cleaner_interval_hours = 48

  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.aks[each.key].id]
  }

  default_node_pool {
    name                         = "system"
    vm_size                      = var.system_node_pool.vm_size
    vnet_subnet_id               = azurerm_subnet.aks[each.key].id
    type                         = "VirtualMachineScaleSets"
    auto_scaling_enabled         = true
    min_count                    = var.system_node_pool.min_count
    max_count                    = var.system_node_pool.max_count
    max_pods                     = 50
    os_disk_type                 = "Ephemeral"
    host_encryption_enabled      = true
    only_critical_addons_enabled = true
    zones                        = ["1", "2", "3"]
    temporary_name_for_rotation  = "systemtmp"
    tags                         = var.tags

    upgrade_settings {
      max_surge = "33%"
    }
  }

  network_profile {
    network_plugin      = "azure"
    network_plugin_mode = "overlay"
    network_data_plane  = "cilium"
    network_policy      = "cilium"
    outbound_type       = "userDefinedRouting"
    load_balancer_sku   = "standard"
    pod_cidr            = "192.168.0.0/16"
    service_cidr        = "172.16.0.0/16"
    dns_service_ip      = "172.16.0.10"
  }

  # Container Insights (logs; its data collection rule and association live in
  # main.monitoring.tf) and the Defender for Containers sensor, both to the shared workspace. The
  # Defender plan itself is enabled on the subscription (main.policy.tf).
  oms_agent {
    log_analytics_workspace_id      = azurerm_log_analytics_workspace.this.id
    msi_auth_for_monitoring_enabled = true
  }
  microsoft_defender {
    log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id
  }
  # Managed Prometheus (the data collection rule association lives in main.monitoring.tf).
  monitor_metrics {}

  # Secrets come from Key Vault through the Secrets Store CSI driver, rotated in place.
  key_vault_secrets_provider {
    secret_rotation_enabled  = true
    secret_rotation_interval = "2m"
  }

  # The regional ingress: the application routing add-on (managed NGINX). Declared here so a
  # re-apply keeps it, and with it the internal load balancer and Private Link Service that
  # Front Door's origin points at. AnnotationControlled lets the NginxIngressController
  # `default` carry the internal-LB and Private Link annotations (docs/deploy.md, step 2). No DNS
  # zones: Front Door resolves the origin through Private Link, not DNS. Its TLS certificate
  # comes from Key Vault through the CSI driver above, read with the add-on's identity
  # (azurerm_role_assignment.ingress_key_vault).
  web_app_routing {
    dns_zone_ids             = []
    default_nginx_controller = "AnnotationControlled"
  }

  # Nodes resolve the private API server through the hub's DNS proxy: the zones are linked to
  # the hub and spoke before the cluster bootstraps.
  depends_on = [
    azurerm_role_assignment.aks_private_dns,
    azurerm_role_assignment.aks_network,
    azurerm_subnet_route_table_association.aks,
    azurerm_private_dns_zone_virtual_network_link.this,
  ]
}

resource "azurerm_kubernetes_cluster_node_pool" "gpu" {
  for_each = var.stamps

  name                    = "gpu"
  kubernetes_cluster_id   = azurerm_kubernetes_cluster.this[each.key].id
  mode                    = "User"
  vm_size                 = var.gpu_node_pool.vm_size
  vnet_subnet_id          = azurerm_subnet.aks[each.key].id
  auto_scaling_enabled    = true
  min_count               = var.gpu_node_pool.min_count
  max_count               = var.gpu_node_pool.max_count
  max_pods                = 50
  os_disk_type            = "Ephemeral"
  os_disk_size_gb         = var.gpu_node_pool.os_disk_size_gb
  host_encryption_enabled = true
  gpu_instance            = var.gpu_node_pool.gpu_instance
  gpu_driver              = "Install" # AKS installs the NVIDIA driver; the device plugin is ours (docs/deploy.md)
  node_taints             = ["nvidia.com/gpu=present:NoSchedule"]
  node_labels = {
    "tenantgate.io/pool" = "gpu"
  }
  tags = var.tags

  # Zonal like the system pool: a zone outage leaves the other zones' engines serving (the
  # engine StatefulSet spreads over topology.kubernetes.io/zone).
  zones = var.gpu_node_pool.zones

  upgrade_settings {
    max_surge = "1"
  }
}

# Cluster admins are Entra ID groups; there is no other way in.
resource "azurerm_role_assignment" "aks_admins" {
  for_each = merge([
    for key, _ in var.stamps : {
      for group in var.aks_admin_group_object_ids : "${key}-${group}" => { stamp = key, group = group }
    }
  ]...)

  scope                = azurerm_kubernetes_cluster.this[each.value.stamp].id
  role_definition_name = "Azure Kubernetes Service RBAC Cluster Admin"
  principal_id         = each.value.group
}

# The application routing add-on reads the ingress certificate from the stamp's vault. The
# certificate's private key is read through its secret, so Key Vault Secrets User is all it
# needs (the role `az aks approuting update --attach-kv` grants on an RBAC vault).
resource "azurerm_role_assignment" "ingress_key_vault" {
  for_each = var.stamps

  scope                = azurerm_key_vault.this[each.key].id
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_kubernetes_cluster.this[each.key].web_app_routing[0].web_app_routing_identity[0].object_id
}
