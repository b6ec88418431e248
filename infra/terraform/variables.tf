variable "name" {
  type        = string
  description = "Short name that prefixes every resource (lowercase letters and digits, 3-10 characters), e.g. `tgprod`."
  nullable    = false

  validation {
    condition     = can(regex("^[a-z][a-z0-9]{2,9}$", var.name))
    error_message = "name must be 3-10 lowercase letters or digits and start with a letter (it ends up in Key Vault and DNS names)."
  }
}

variable "location" {
  type        = string
  description = "Region of the shared resources: the platform resource group, Log Analytics, the Azure Monitor workspace and the bundle storage."
  nullable    = false

  validation {
    condition     = can(regex("^[a-z][a-z0-9]+$", var.location))
    error_message = "location must be an Azure region name such as westeurope (lowercase, no spaces)."
  }
}

variable "stamps" {
  type = map(object({
    location      = string
    address_space = string
    ingress = optional(object({
      host_name               = string
      private_link_service_id = string
    }))
  }))
  description = <<-EOT
    One deployment stamp per region, keyed by a short code (1-4 lowercase letters or digits), e.g.
    `{ weu = { location = "westeurope", address_space = "10.10.0.0/16" } }`. Two stamps give the
    active/active option: both serve traffic behind one Front Door. Each stamp gets its own hub
    (Azure Firewall), spoke, AKS cluster, Key Vault and Azure Managed Redis.

    - `location` - Azure region of the stamp.
    - `address_space` - a /16 split into the hub (/18) and the spoke (/17).
    - `ingress` - (Optional) the in-cluster ingress, once it exists (see docs/deploy.md): the host
      name its TLS certificate is for, and the Private Link Service its internal load balancer
      creates. Front Door gets a private-link origin for the stamp once it is set.
  EOT
  nullable    = false

  validation {
    condition     = length(var.stamps) >= 1 && length(var.stamps) <= 2
    error_message = "stamps must hold one region, or two for the active/active option."
  }
  validation {
    condition     = alltrue([for key, stamp in var.stamps : can(regex("^[a-z0-9]{1,4}$", key))])
    error_message = "Each stamp key must be 1-4 lowercase letters or digits (it ends up in Key Vault names)."
  }
  validation {
    condition     = alltrue([for stamp in var.stamps : can(cidrhost(stamp.address_space, 0)) && endswith(stamp.address_space, "/16")])
    error_message = "Each stamp's address_space must be an IPv4 /16, e.g. 10.10.0.0/16."
  }
  validation {
    condition     = length(distinct([for stamp in var.stamps : stamp.location])) == length(var.stamps)
    error_message = "Each stamp must be in a different region."
  }
}

variable "tags" {
  type        = map(string)
  description = "Tags for every resource. Must carry `tenantId`, `costCenter`, `environment` and `owner`: the Azure Policy assignments this module makes deny resources without them."
  nullable    = false

  validation {
    condition     = alltrue([for tag in ["tenantId", "costCenter", "environment", "owner"] : contains(keys(var.tags), tag)])
    error_message = "tags must include tenantId, costCenter, environment and owner."
  }
}

variable "aks_admin_group_object_ids" {
  type        = list(string)
  description = "Object IDs of the Entra ID groups that get `Azure Kubernetes Service RBAC Cluster Admin` on every cluster. Local accounts are disabled, so these groups are the only way in."
  nullable    = false

  validation {
    condition     = length(var.aks_admin_group_object_ids) > 0 && alltrue([for id in var.aks_admin_group_object_ids : can(regex("^[0-9a-fA-F-]{36}$", id))])
    error_message = "aks_admin_group_object_ids must list at least one Entra ID group object ID (a GUID)."
  }
}

variable "private_cluster_enabled" {
  type        = bool
  description = "Whether the AKS API server is private, reachable only from the VNets (the default). Set to false to use a public API server limited to `api_server_authorized_ip_ranges` instead."
  default     = true
  nullable    = false
}

variable "api_server_authorized_ip_ranges" {
  type        = list(string)
  description = "CIDR ranges allowed to reach a public API server. Required when `private_cluster_enabled` is false, ignored otherwise (and the private-cluster policy assignment is then left out)."
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for cidr in var.api_server_authorized_ip_ranges : can(cidrhost(cidr, 0)) && cidr != "0.0.0.0/0"])
    error_message = "api_server_authorized_ip_ranges must be CIDR ranges, and 0.0.0.0/0 is not a restriction."
  }
  validation {
    condition     = var.private_cluster_enabled || length(var.api_server_authorized_ip_ranges) > 0
    error_message = "A public API server (private_cluster_enabled = false) needs at least one range in api_server_authorized_ip_ranges."
  }
}

variable "system_node_pool" {
  type = object({
    vm_size   = optional(string, "Standard_D4ds_v5")
    min_count = optional(number, 3)
    max_count = optional(number, 5)
  })
  description = "The system pool (critical add-ons only): VM size (with a temp disk large enough for ephemeral OS disks) and autoscaler bounds."
  default     = {}
  nullable    = false

  validation {
    condition     = var.system_node_pool.min_count >= 2 && var.system_node_pool.max_count >= var.system_node_pool.min_count
    error_message = "system_node_pool needs min_count >= 2 (survives a node loss) and max_count >= min_count."
  }
}

variable "gpu_node_pool" {
  type = object({
    vm_size         = optional(string, "Standard_NC24ads_A100_v4")
    min_count       = optional(number, 1)
    max_count       = optional(number, 4)
    gpu_instance    = optional(string)
    zones           = optional(list(string), ["1", "2", "3"])
    os_disk_size_gb = optional(number, 64)
  })
  description = <<-EOT
    The GPU pool that runs the engine. Nodes carry the taint `nvidia.com/gpu=present:NoSchedule`.
    - `gpu_instance` - (Optional) MIG profile (`MIG1g`, `MIG2g`, `MIG3g`, `MIG4g`, `MIG7g`) for
      A100/H100 sizes; pods then request `nvidia.com/mig-<profile>` slices instead of whole GPUs.
    - `zones` - availability zones the pool spreads over (default all three). Set `[]` in a region
      where the GPU size has no zonal capacity (`az vm list-skus -l <region> --size <size> --zone`).
    - `os_disk_size_gb` - (Optional) The ephemeral OS disk, which must fit the size's temp disk
      (64 GiB on Standard_NC24ads_A100_v4). Left unset, AKS would ask for 128 GiB there, which
      does not fit, and the pool would fail to create.
  EOT
  default     = {}
  nullable    = false

  validation {
    condition     = var.gpu_node_pool.gpu_instance == null || contains(["MIG1g", "MIG2g", "MIG3g", "MIG4g", "MIG7g"], coalesce(var.gpu_node_pool.gpu_instance, "none"))
    error_message = "gpu_node_pool.gpu_instance must be null or one of MIG1g, MIG2g, MIG3g, MIG4g, MIG7g."
  }
  validation {
    # Temp disk sizes of the NC A100 v4 sizes; other sizes are checked by AKS at apply.
    condition = var.gpu_node_pool.os_disk_size_gb >= 30 && var.gpu_node_pool.os_disk_size_gb <= lookup({
      Standard_NC24ads_A100_v4 = 64
      Standard_NC48ads_A100_v4 = 128
      Standard_NC96ads_A100_v4 = 256
    }, var.gpu_node_pool.vm_size, 2040)
    error_message = "gpu_node_pool.os_disk_size_gb must be at least 30 and fit the VM size's temp disk, where the ephemeral OS disk lives: at most 64 on Standard_NC24ads_A100_v4, 128 on Standard_NC48ads_A100_v4, 256 on Standard_NC96ads_A100_v4."
  }
  validation {
    condition     = var.gpu_node_pool.min_count >= 0 && var.gpu_node_pool.max_count >= max(1, var.gpu_node_pool.min_count)
    error_message = "gpu_node_pool needs min_count >= 0 and max_count >= max(1, min_count)."
  }
  validation {
    condition     = alltrue([for zone in var.gpu_node_pool.zones : contains(["1", "2", "3"], zone)])
    error_message = "gpu_node_pool.zones must list zones among \"1\", \"2\" and \"3\" (or be empty)."
  }
}

variable "gateway_service_account" {
  type = object({
    namespace = optional(string, "tenantgate")
    name      = optional(string, "tenantgate-gateway")
  })
  description = "The Kubernetes service account of the gateway (the Helm chart's defaults). Its federated credential lets it act as the gateway's user-assigned identity."
  default     = {}
  nullable    = false

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", var.gateway_service_account.namespace)) && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", var.gateway_service_account.name))
    error_message = "gateway_service_account namespace and name must be DNS-1123 labels."
  }
}

variable "log_retention_days" {
  type        = number
  description = "Days Log Analytics keeps logs (365 or more: audit and WAF logs are evidence)."
  default     = 365
  nullable    = false

  validation {
    condition     = var.log_retention_days >= 365 && var.log_retention_days <= 730
    error_message = "log_retention_days must be between 365 and 730."
  }
}

variable "kubernetes_policy_effect" {
  type        = string
  description = <<-EOT
    Effect of the Kubernetes policies assigned on every cluster (pod security baseline, allowed
    registries, internal load balancers): `deny` (the default) refuses a non-compliant pod or
    Service at admission; `audit` only reports it, for a first rollout on a cluster that already
    runs workloads. The chart complies with all three, so `deny` costs it nothing.
  EOT
  default     = "deny"
  nullable    = false

  validation {
    condition     = contains(["audit", "deny"], var.kubernetes_policy_effect)
    error_message = "kubernetes_policy_effect must be audit or deny."
  }
}

variable "allowed_registry" {
  type        = string
  description = "Regular expression that every container image outside the AKS-managed namespaces must match. Default (null): each stamp's own container registry, `^acr<name><stamp>\\.azurecr\\.io/.+$` (the registry the images are imported into, see docs/deploy.md)."
  default     = null

  validation {
    condition     = var.allowed_registry == null || can(regex("^\\^", coalesce(var.allowed_registry, "^")))
    error_message = "allowed_registry must be an anchored regular expression (start with ^), or null for each stamp's own registry."
  }
}

variable "maintenance_windows" {
  type = object({
    auto_upgrade = optional(object({
      day_of_week    = optional(string, "Sunday")
      start_time     = optional(string, "02:00")
      utc_offset     = optional(string, "+00:00")
      duration_hours = optional(number, 4)
    }), {})
    node_os = optional(object({
      day_of_week    = optional(string, "Saturday")
      start_time     = optional(string, "02:00")
      utc_offset     = optional(string, "+00:00")
      duration_hours = optional(number, 4)
    }), {})
  })
  description = <<-EOT
    Weekly windows in which AKS may apply what `automatic_upgrade_channel` (patch versions) and
    `node_os_upgrade_channel` (node images) bring: `day_of_week`, `start_time` (HH:MM),
    `utc_offset` (+HH:MM) and `duration_hours` (4-24). Defaults: node images Saturday, Kubernetes
    patches Sunday, both 02:00 UTC for 4 hours, so the two never roll nodes at once.
  EOT
  default     = {}
  nullable    = false

  validation {
    condition = alltrue([
      for window in [var.maintenance_windows.auto_upgrade, var.maintenance_windows.node_os] :
      contains(["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"], window.day_of_week)
      && can(regex("^([01][0-9]|2[0-3]):[0-5][0-9]$", window.start_time))
      && can(regex("^[+-](0[0-9]|1[0-4]):[0-5][0-9]$", window.utc_offset))
      && window.duration_hours >= 4 && window.duration_hours <= 24
    ])
    error_message = "maintenance_windows: day_of_week a weekday name, start_time HH:MM, utc_offset +HH:MM or -HH:MM, duration_hours 4-24."
  }
}

variable "customer_managed_key_enabled" {
  type        = bool
  description = <<-EOT
    Whether the bundle storage account is encrypted with a key of your own (RSA-HSM 3072 in a
    Key Vault of the platform resource group, rotated yearly) instead of Microsoft-managed keys.
    Off by default: the account holds signed policy code, not tenant data, and is already
    encrypted twice (infrastructure encryption). On, the vault lets the storage service in as a
    trusted service, and gets a private endpoint in the spoke of the stamp in `location` (the
    Terraform runner creates the key over it, so deploy from that network).
  EOT
  default     = false
  nullable    = false
}

variable "grafana_dashboard_enabled" {
  type        = bool
  description = <<-EOT
    Whether the chart's dashboard (infra/helm/tenantgate/files/dashboard.json) is written into
    Managed Grafana, in a folder `tenantgate`, through Grafana's own API with the root module's
    `grafana` provider. Off by default: Grafana has no public endpoint, so only an apply from
    inside the network can reach it (a runner in a stamp's hub or spoke, or a network that
    resolves through the hub firewall's DNS proxy), after the first apply has created Grafana
    and its private endpoints. The identity that runs the apply needs Grafana Editor or Admin.
  EOT
  default     = false
  nullable    = false
}
