# One stamp in West Europe: hub and spoke, a private AKS cluster with a system and a GPU pool.
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

  name     = "tgdemo"
  location = "westeurope"

  stamps = {
    weu = {
      location      = "westeurope"
      address_space = "10.10.0.0/16"
    }
  }

  # Once Grafana and its private endpoints exist, apply with true from inside the network.
  grafana_dashboard_enabled = false

  aks_admin_group_object_ids = ["00000000-0000-0000-0000-000000000001"]

  tags = {
    tenantId    = "platform"
    costCenter  = "cc-1234"
    environment = "dev"
    owner       = "platform-team@example.com"
  }
}
