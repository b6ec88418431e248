output "ids" {
  description = "The private endpoints' IDs, by stamp key."
  value       = { for key, endpoint in azurerm_private_endpoint.this : key => endpoint.id }
}
