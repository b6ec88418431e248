variable "endpoints" {
  type = map(object({
    name                = string
    location            = string
    resource_group_name = string
    subnet_id           = string
    resource_id         = string
    private_dns_zone_id = string
  }))
  description = <<-EOT
    The endpoints, by stamp key:

    - `name` - the endpoint's name.
    - `location`, `resource_group_name`, `subnet_id` - where it lives: the stamp's region, resource group and endpoint subnet.
    - `resource_id` - the resource it connects to.
    - `private_dns_zone_id` - the private DNS zone its zone group registers it in.
  EOT
  nullable    = false
}

variable "connection_name" {
  type        = string
  description = "Name of each endpoint's private service connection (the service's, e.g. `key-vault`)."
  nullable    = false
}

variable "subresource_name" {
  type        = string
  description = "The private link group the endpoints connect to (`vault`, `blob`, ...)."
  nullable    = false
}

variable "tags" {
  type        = map(string)
  description = "Tags for every endpoint."
  default     = {}
  nullable    = false
}
