output "stamps" {
  description = "Per stamp, what the Helm chart needs (see the module's output of the same name)."
  value       = module.tenantgate.stamps
}
