# METADATA
# title: Prefix-cache scope
# description: |
#   Which prefix-cache entries a request may reuse. The namespace is a plain
#   string here ("tenant:<tenant_id>", "principal:<tenant_id>:<object_id>",
#   "shared", or "" for no cache); the engine keys it with an HMAC.
#
#   Public prefix segments: exact token sequences (a platform system prompt, a
#   tool list) whose whole KV blocks everyone given the segment shares, while the
#   rest of the prompt stays in the request's own scope. A tenant may use the
#   platform's segments it names (data.platform_segments) and publishes its own
#   for its principals; only tenant and principal scopes take them (shared
#   shares everything already, none shares nothing).
package tenantgate.cache

# The caller's tenant record, shared by the decision's packages (policies/tenant).
import data.tenantgate.tenant.record as _tenant

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

_segmented if scope in {"tenant", "principal"}

# A platform segment the tenant opted into: one namespace for every tenant that did.
segments contains _segment(s, ["segment", "platform", s.digest]) if {
	_segmented
	some name in _collection(object.get(_tenant, ["cache_segments", "platform"], []))
	s := data.platform_segments[name]
}

# The tenant's own segment: shared by its principals (the difference under principal scope).
segments contains _segment(s, ["segment", "tenant", input.principal.tenant_id, s.digest]) if {
	_segmented
	some s in _collection(object.get(_tenant, ["cache_segments", "own"], {}))
}

# A list or an object as it is; any other value as no segment at all. OPA iterates a number or a
# string as nothing where regorus refuses to: both now share nothing for it, and fewer segments share
# less, never more.
_collection(value) := value if {
	is_array(value)
} else := value if {
	is_object(value)
} else := []

_segment(s, parts) := {"digest": s.digest, "tokens": s.tokens, "namespace": concat(":", parts)}
