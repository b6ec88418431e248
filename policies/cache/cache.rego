# METADATA
# title: Prefix-cache scope
# description: |
#   Which prefix-cache entries a request may reuse. The namespace is a plain
#   string here ("tenant:<tenant_id>", "principal:<tenant_id>:<object_id>",
#   "shared", or "" for no cache); the engine keys it with an HMAC.
package tenantgate.cache

_tenant := data.tenants[input.principal.tenant_id]

_classification := input.request.data_classification

default scope := "none"

# Restricted data never enters a cache; shared (cross-tenant) reuse is for public data only.
scope := "none" if {
	_classification == "restricted"
} else := "tenant" if {
	_tenant.cache_scope == "shared"
	_classification != "public"
} else := _tenant.cache_scope

default namespace := ""

namespace := concat(":", ["tenant", input.principal.tenant_id]) if scope == "tenant"

namespace := concat(":", ["principal", input.principal.tenant_id, input.principal.object_id]) if {
	scope == "principal"
}

namespace := "shared" if scope == "shared"

notes contains "restricted data: prefix cache disabled" if {
	_classification == "restricted"
	_tenant.cache_scope != "none"
}

notes contains "non-public data: shared prefix cache narrowed to the tenant" if {
	_classification != "restricted"
	_tenant.cache_scope == "shared"
	scope == "tenant"
}
