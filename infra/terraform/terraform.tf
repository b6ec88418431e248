terraform {
  required_version = ">= 1.9, < 2.0"

  required_providers {
    # 4.60 is the first release with azurerm_managed_redis_access_policy_assignment (Entra ID
    # access to Azure Managed Redis); 5.x renames attributes this module uses.
    azurerm = {
      source  = "hashicorp/azurerm"
      version = ">= 4.60, < 5.0"
    }
    # Grafana's own API, for the dashboard in Managed Grafana (grafana_dashboard_enabled); the
    # root module configures it (the examples do). 3.x and 4.x have the folder and dashboard
    # resources used here.
    grafana = {
      source  = "grafana/grafana"
      version = ">= 3.0, < 5.0"
    }
  }
}
