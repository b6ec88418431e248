terraform {
  required_version = ">= 1.9, < 2.0"

  required_providers {
    # 4.60 is the first release with azurerm_managed_redis_access_policy_assignment (Entra ID
    # access to Azure Managed Redis); 5.x renames attributes this module uses.
    azurerm = {
      source  = "hashicorp/azurerm"
      version = ">= 4.60, < 5.0"
    }
  }
}
