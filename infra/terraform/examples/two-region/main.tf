# Two stamps, active/active behind one Front Door, A100 nodes split into MIG 1g slices.
# Apply once, install the Helm chart in each cluster (its ingress creates a Private Link
# Service), then set `ingress` for both stamps and apply again: Front Door gets its origins.
terraform {
  required_version = ">= 1.9, < 2.0"

  required_providers {
    azurerm = {
      source  = "hashicorp/azurerm"
      version = ">= 4.60, < 5.0"
    }
    grafana = {
      source  = "grafana/grafana"
      version = ">= 3.0, < 5.0"
    }
  }
}

provider "azurerm" {
  features {
    # The bundle account is private and keyless: the provider must not probe its data plane
    # (queue and static website properties), which it cannot reach from outside the spokes.
    storage {
      data_plane_available = false
    }
  }
  storage_use_azuread = true
}

# Grafana's API, for the dashboard (grafana_dashboard_enabled). It takes an Entra ID access token
# for Managed Grafana from GRAFANA_AUTH, got by the identity that applies (Grafana Editor or Admin):
#   export GRAFANA_AUTH="$(az account get-access-token --resource https://dashboard.azure.com --query accessToken -o tsv)"
provider "grafana" {
  url = module.tenantgate.grafana_endpoint
}

module "tenantgate" {
  source = "../../"

  name     = "tgprod"
  location = "westeurope"

  stamps = {
    weu = {
      location      = "westeurope"
      address_space = "10.10.0.0/16"
      ingress = {
        host_name               = "weu.tenantgate.example.com"
        private_link_service_id = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg-tgprod-weu-nodes/providers/Microsoft.Network/privateLinkServices/pls-tenantgate-ingress"
      }
    }
    neu = {
      location      = "northeurope"
      address_space = "10.20.0.0/16"
      ingress = {
        host_name               = "neu.tenantgate.example.com"
        private_link_service_id = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg-tgprod-neu-nodes/providers/Microsoft.Network/privateLinkServices/pls-tenantgate-ingress"
      }
    }
  }

  gpu_node_pool = {
    vm_size      = "Standard_NC24ads_A100_v4"
    min_count    = 2
    max_count    = 8
    gpu_instance = "MIG1g"
  }

  # Once Grafana and its private endpoints exist, apply with true from inside the network.
  grafana_dashboard_enabled = false

  aks_admin_group_object_ids = ["00000000-0000-0000-0000-000000000001"]

  tags = {
    tenantId    = "platform"
    costCenter  = "cc-1234"
    environment = "production"
    owner       = "platform-team@example.com"
  }
}
