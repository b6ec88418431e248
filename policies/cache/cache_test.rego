package tenantgate.cache_test

import data.tenantgate.cache

_tenants := {
	"t-shared": {"cache_scope": "shared"},
	"t-tenant": {"cache_scope": "tenant"},
	"t-principal": {"cache_scope": "principal"},
	"t-none": {"cache_scope": "none"},
}

_input(tenant_id, classification) := {
	"principal": {"tenant_id": tenant_id, "object_id": "o1"},
	"request": {"data_classification": classification},
}

_cache(tenant_id, classification) := result if {
	result := {"scope": cache.scope, "namespace": cache.namespace, "notes": cache.notes}
		with input as _input(tenant_id, classification)
		with data.tenants as _tenants
}

test_allow_tenant_scope_namespace if {
	c := _cache("t-tenant", "internal")
	c.scope == "tenant"
	c.namespace == "tenant:t-tenant"
	c.notes == set()
}

test_allow_principal_scope_namespace if {
	c := _cache("t-principal", "confidential")
	c.scope == "principal"
	c.namespace == "principal:t-principal:o1"
}

test_allow_shared_scope_for_public_data if {
	c := _cache("t-shared", "public")
	c.scope == "shared"
	c.namespace == "shared"
	c.notes == set()
}

test_deny_shared_scope_for_non_public_data if {
	c := _cache("t-shared", "confidential")
	c.scope == "tenant"
	c.namespace == "tenant:t-shared"
	c.notes == {"non-public data: shared prefix cache narrowed to the tenant"}
}

test_deny_cache_for_restricted_data if {
	every tenant_id in ["t-shared", "t-tenant", "t-principal"] {
		c := _cache(tenant_id, "restricted")
		c.scope == "none"
		c.namespace == ""
		c.notes == {"restricted data: prefix cache disabled"}
	}
}

test_deny_cache_for_tenant_without_cache if {
	c := _cache("t-none", "public")
	c.scope == "none"
	c.namespace == ""
	c.notes == set()
}

test_deny_cache_for_unknown_tenant if {
	c := _cache("nobody", "public")
	c.scope == "none"
	c.namespace == ""
}
