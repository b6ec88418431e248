# METADATA
# title: Authentication requirements and revocation
# description: |
#   Which Conditional Access authentication contexts (Entra `acrs`, c1..c99) a
#   request needs and how recent its sign-in must be, from the tenant's data: for
#   the whole tenant, per model, per route and per data classification. And whether
#   the tenant's data revokes the caller: its object id, its session, or every
#   token of the tenant issued before a time. The gateway answers a missing
#   context with Entra's claims challenge (to clients that declared `cp1`) or a
#   403, a revoked token with a challenge or a 401, and compares `max_age_s` with
#   the token's `auth_time` itself (the clock stays out of the policy, so its
#   decisions stay cacheable). Every value is type-checked before it is iterated
#   or compared: engines differ on iterating a string or ordering mixed types, and
#   requirement data of the wrong shape must deny, never require nothing.
package tenantgate.authn

# The caller's tenant record, shared by the decision's packages (policies/tenant).
import data.tenantgate.tenant.record as _tenant

# Defaults rather than object.get on a tenant that may be undefined: `not` over an undefined
# value is where engines part ways, so every value read below is defined.
default _requirements := {}

_requirements := _tenant.authentication

default _revocations := {}

_revocations := _tenant.revocations

# The requirement objects that apply to this request; each is {"contexts": [...], "max_age_s": N}.
_applicable contains requirement if requirement := _requirements.tenant

_applicable contains requirement if requirement := _requirements.models[input.request.model]

_applicable contains requirement if requirement := _requirements.routes[input.request.route]

_applicable contains requirement if {
	requirement := _requirements.classifications[input.request.data_classification]
}

# Data this policy cannot read: the decision is then left undefined, and the default denies.
_malformed if not is_object(_requirements)

_malformed if {
	some requirement in _applicable
	not _well_formed(requirement)
}

_well_formed(requirement) if {
	is_object(requirement)
	contexts := object.get(requirement, "contexts", [])
	is_array(contexts)
	every context in contexts {
		regex.match(`^c([1-9]|[1-9][0-9])$`, context)
	}
	age := object.get(requirement, "max_age_s", 0)
	is_number(age)
	age >= 0
}

# METADATA
# description: Every authentication context the request needs, sorted.
contexts := [] if {
	# Most tenants need nothing: answered before _applicable and _malformed, which cost regorus
	# some microseconds per rule body evaluated, even when they find nothing.
	_requirements == {}
} else := sort({context |
	some requirement in _applicable
	_well_formed(requirement)
	some context in object.get(requirement, "contexts", [])
}) if {
	not _malformed
}

# The token's acrs as the gateway validated it (absent, or not a list: none). Read through
# object.get on the one member, so the decision cache keys on acrs, not on the whole principal.
_acrs := value if {
	value := object.get(input.principal, "acrs", [])
	is_array(value)
} else := []

_token_contexts := {context | some context in _acrs}

# METADATA
# description: The needed contexts the token does not carry, sorted.
missing := [context | some context in contexts; not _token_contexts[context]]

_ages := {age |
	some requirement in _applicable
	_well_formed(requirement)
	age := object.get(requirement, "max_age_s", 0)
	age > 0
}

# METADATA
# description: The oldest sign-in (seconds since auth_time) the request accepts; 0 for any.
max_age_s := 0 if {
	_requirements == {}
} else := min(_ages) if {
	not _malformed
	count(_ages) > 0
} else := 0 if not _malformed

# METADATA
# description: Whether the tenant's data revokes this token.
default revoked := false

# One rule with an else chain rather than four rules: regorus pays some microseconds for every
# rule body it evaluates, and most tenants revoke nothing, which the first branch answers alone.
revoked := false if {
	_revocations == {}
} else if {
	_principal_revoked
} else if {
	_session_revoked
} else if {
	_issued_before_cutoff
} else if {
	_revocations_malformed
}

_principal_revoked if input.principal.object_id in _list(_revocations, "principals")

_session_revoked if {
	is_string(input.principal.sid)
	input.principal.sid in _list(_revocations, "sessions")
}

_issued_before_cutoff if {
	is_number(input.principal.iat)
	is_number(_revocations.issued_before)
	input.principal.iat < _revocations.issued_before
}

# Revocation data that cannot be read revokes every token of the tenant: it fails closed.
_revocations_malformed if not is_object(_revocations)

_revocations_malformed if {
	some name in ["principals", "sessions"]
	not is_array(object.get(_revocations, name, []))
}

_revocations_malformed if {
	_revocations.issued_before != null
	not is_number(_revocations.issued_before)
}

# A member that must be a list, as one: [] when absent or of another type.
_list(document, name) := value if {
	value := object.get(document, name, [])
	is_array(value)
} else := []

# METADATA
# description: |
#   Whether the client may be sent a claims challenge: it declared the `cp1`
#   capability (xms_cc). Others get a 403 or a 401 instead, as Entra requires.
default challenge := false

# The token's xms_cc read in the one body rather than through a helper rule (one rule fewer to
# evaluate); object.get on the one member keeps the decision cache keyed on xms_cc alone.
challenge if {
	xms_cc := object.get(input.principal, "xms_cc", [])
	is_array(xms_cc)
	"cp1" in xms_cc
}

deny contains "the caller's token has been revoked" if revoked

deny contains concat(" ", ["this request needs authentication context", context]) if some context in missing
