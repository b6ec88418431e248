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

_digest_a := "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

_digest_b := "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

_platform := {"assistant": {"digest": _digest_a, "tokens": 1024}, "unused": {"digest": _digest_b, "tokens": 64}}

_segmented_tenants := {
	"t-tenant": {"cache_scope": "tenant", "cache_segments": {"platform": ["assistant"]}},
	"t-principal": {"cache_scope": "principal", "cache_segments": {"own": {"kb": {"digest": _digest_b, "tokens": 96}}}},
	"t-shared": {"cache_scope": "shared", "cache_segments": {"platform": ["assistant"]}},
	"t-plain": {"cache_scope": "tenant"},
}

_segments(tenant_id, classification) := result if {
	result := cache.segments with input as _input(tenant_id, classification)
		with data.tenants as _segmented_tenants
		with data.platform_segments as _platform
}

test_allow_platform_segment_the_tenant_opted_into if {
	_segments("t-tenant", "internal") == {{"digest": _digest_a, "tokens": 1024, "namespace": concat(":", ["segment", "platform", _digest_a])}}
}

test_allow_own_segment_shared_by_the_tenants_principals if {
	_segments("t-principal", "confidential") == {{"digest": _digest_b, "tokens": 96, "namespace": concat(":", ["segment", "tenant", "t-principal", _digest_b])}}
}

test_deny_segments_without_opt_in if {
	_segments("t-plain", "internal") == set()
}

test_deny_segments_for_restricted_data if {
	_segments("t-tenant", "restricted") == set()
}

test_deny_segments_where_everything_is_shared if {
	_segments("t-shared", "public") == set()
}

test_allow_segments_when_shared_scope_is_narrowed if {
	count(_segments("t-shared", "confidential")) == 1
}

test_deny_unknown_platform_segment if {
	tenants := {"t": {"cache_scope": "tenant", "cache_segments": {"platform": ["missing"]}}}
	segments := cache.segments with input as _input("t", "internal") with data.tenants as tenants
		with data.platform_segments as _platform
	segments == set()
}
