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
#   decisions stay cacheable).
package tenantgate.authn

_tenant := data.tenants[input.principal.tenant_id]

_requirements := object.get(_tenant, "authentication", {})

_revocations := object.get(_tenant, "revocations", {})

# The requirement objects that apply to this request; each is {"contexts": [...], "max_age_s": N}.
_applicable contains requirement if requirement := _requirements.tenant

_applicable contains requirement if requirement := _requirements.models[input.request.model]

_applicable contains requirement if requirement := _requirements.routes[input.request.route]

_applicable contains requirement if {
	requirement := _requirements.classifications[input.request.data_classification]
}

# METADATA
# description: Every authentication context the request needs, sorted.
contexts := sort({context |
	some requirement in _applicable
	some context in object.get(requirement, "contexts", [])
})

# The token's acrs as the gateway validated it (absent: none).
_token_contexts := {context | some context in input.principal.acrs}

# METADATA
# description: The needed contexts the token does not carry, sorted.
missing := [context | some context in contexts; not _token_contexts[context]]

_ages := {age |
	some requirement in _applicable
	age := object.get(requirement, "max_age_s", 0)
	is_number(age)
	age > 0
}

# METADATA
# description: The oldest sign-in (seconds since auth_time) the request accepts; 0 for any.
default max_age_s := 0

max_age_s := min(_ages) if count(_ages) > 0

# METADATA
# description: Whether the tenant's data revokes this token.
default revoked := false

revoked if _principal_revoked

revoked if _session_revoked

revoked if _issued_before_cutoff

_principal_revoked if input.principal.object_id in object.get(_revocations, "principals", [])

_session_revoked if {
	is_string(input.principal.sid)
	input.principal.sid in object.get(_revocations, "sessions", [])
}

# A cutoff that is not a number revokes every token of the tenant: data that cannot be read fails closed.
_issued_before_cutoff if {
	_revocations.issued_before != null
	not is_number(_revocations.issued_before)
}

_issued_before_cutoff if {
	is_number(input.principal.iat)
	is_number(_revocations.issued_before)
	input.principal.iat < _revocations.issued_before
}

# METADATA
# description: |
#   Whether the client may be sent a claims challenge: it declared the `cp1`
#   capability (xms_cc). Others get a 403 or a 401 instead, as Entra requires.
default challenge := false

challenge if "cp1" in input.principal.xms_cc

deny contains "the caller's token has been revoked" if revoked

deny contains concat(" ", ["this request needs authentication context", context]) if some context in missing
