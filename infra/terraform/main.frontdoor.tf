# ---------------------------------------------------------------------------------------------
# Front Door Premium: the one public entry point. A WAF policy in Prevention mode with the
# managed default and bot rule sets guards the endpoint; each stamp's ingress is an origin
# reached over Private Link (the ingress has no public address). With two stamps both origins
# take traffic (active/active) and a failed health probe takes a region out of rotation.
# ---------------------------------------------------------------------------------------------

locals {
  front_door_origins = { for key, stamp in var.stamps : key => stamp if stamp.ingress != null }
}

resource "azurerm_cdn_frontdoor_profile" "this" {
  name                = "afd-${var.name}"
  resource_group_name = azurerm_resource_group.this.name
  sku_name            = "Premium_AzureFrontDoor"
  # Streams of generated tokens can take a while before the last byte.
  response_timeout_seconds = 240
  tags                     = var.tags
}

resource "azurerm_cdn_frontdoor_firewall_policy" "this" {
  name                              = "waf${var.name}"
  resource_group_name               = azurerm_resource_group.this.name
  sku_name                          = "Premium_AzureFrontDoor"
  enabled                           = true
  mode                              = "Prevention"
  request_body_check_enabled        = true
  custom_block_response_status_code = 403
  tags                              = var.tags

  managed_rule {
    type    = "Microsoft_DefaultRuleSet"
    version = "2.1"
    action  = "Block"

    # The prompt is data for a model, not input to SQL, a shell or a browser, so SQLi/XSS/RCE
    # signatures in it are false positives that would block ordinary prompts about code. Only
    # the values of the two prompt fields are exempt: chat `messages` and completions `prompt`
    # (StartsWith, so the WAF's names for nested keys such as messages[].content are covered;
    # the gateway rejects any other body field, so no other name can match). Every rule still
    # inspects headers, URL, query and all other fields. The exclusion is rule-set wide because
    # DRS has no narrower safe scope for it: a rule-group override without a rule list disables
    # the whole group, and per-rule overrides would have to list every rule ID of 2.1.
    # docs/deploy.md, "What the WAF inspects".
    exclusion {
      match_variable = "RequestBodyJsonArgNames"
      operator       = "StartsWith"
      selector       = "messages"
    }
    exclusion {
      match_variable = "RequestBodyJsonArgNames"
      operator       = "StartsWith"
      selector       = "prompt"
    }
  }

  managed_rule {
    type    = "Microsoft_BotManagerRuleSet"
    version = "1.1"
    action  = "Block"
  }
}

resource "azurerm_cdn_frontdoor_endpoint" "this" {
  name                     = "fde-${var.name}"
  cdn_frontdoor_profile_id = azurerm_cdn_frontdoor_profile.this.id
  tags                     = var.tags
}

resource "azurerm_cdn_frontdoor_security_policy" "this" {
  name                     = "waf"
  cdn_frontdoor_profile_id = azurerm_cdn_frontdoor_profile.this.id

  security_policies {
    firewall {
      cdn_frontdoor_firewall_policy_id = azurerm_cdn_frontdoor_firewall_policy.this.id

      association {
        patterns_to_match = ["/*"]

        domain {
          cdn_frontdoor_domain_id = azurerm_cdn_frontdoor_endpoint.this.id
        }
      }
    }
  }
}

resource "azurerm_cdn_frontdoor_origin_group" "this" {
  name                     = "tenantgate"
  cdn_frontdoor_profile_id = azurerm_cdn_frontdoor_profile.this.id
  session_affinity_enabled = false

  load_balancing {
    sample_size                        = 4
    successful_samples_required        = 3
    additional_latency_in_milliseconds = 50
  }

  health_probe {
    path                = "/readyz"
    protocol            = "Https"
    request_type        = "GET"
    interval_in_seconds = 30
  }
}

resource "azurerm_cdn_frontdoor_origin" "stamp" {
  for_each = local.front_door_origins

  name                           = "stamp-${each.key}"
  cdn_frontdoor_origin_group_id  = azurerm_cdn_frontdoor_origin_group.this.id
  enabled                        = true
  host_name                      = each.value.ingress.host_name
  origin_host_header             = each.value.ingress.host_name
  certificate_name_check_enabled = true
  https_port                     = 443
  http_port                      = 80
  priority                       = 1
  weight                         = 500

  private_link {
    request_message        = "Front Door ${var.name} to the ${each.key} ingress"
    location               = each.value.location
    private_link_target_id = each.value.ingress.private_link_service_id
  }
}

resource "azurerm_cdn_frontdoor_route" "this" {
  count = length(local.front_door_origins) > 0 ? 1 : 0

  name                          = "tenantgate"
  cdn_frontdoor_endpoint_id     = azurerm_cdn_frontdoor_endpoint.this.id
  cdn_frontdoor_origin_group_id = azurerm_cdn_frontdoor_origin_group.this.id
  cdn_frontdoor_origin_ids      = [for origin in azurerm_cdn_frontdoor_origin.stamp : origin.id]
  supported_protocols           = ["Https"]
  patterns_to_match             = ["/*"]
  forwarding_protocol           = "HttpsOnly"
  https_redirect_enabled        = false
  link_to_default_domain        = true
}
