output "front_door_endpoint_host_name" {
  description = "The public host name (Front Door endpoint) that apps call."
  value       = module.tenantgate.front_door_endpoint_host_name
}

output "stamps" {
  description = "Per stamp, what the Helm chart needs (see the module's output of the same name)."
  value       = module.tenantgate.stamps
}
