package tenantgate.authn_test

import data.tenantgate.authn

_tenants := {
	"t-plain": {},
	"t-ca": {
		"authentication": {
			"tenant": {"contexts": ["c9"]},
			"models": {"m-secure": {"contexts": ["c2"], "max_age_s": 7200}},
			"routes": {"responses": {"contexts": ["c3"]}},
			"classifications": {"restricted": {"contexts": ["c1"], "max_age_s": 3600}},
		},
		"revocations": {
			"principals": ["o-revoked"],
			"sessions": ["s-revoked"],
			"issued_before": 1000,
		},
	},
	"t-bad-cutoff": {"revocations": {"issued_before": "yesterday"}},
	"t-bad-list": {"revocations": {"principals": "o1"}},
	"t-bad-contexts": {"authentication": {"models": {"m": {"contexts": "c1"}}}},
	"t-bad-context-id": {"authentication": {"tenant": {"contexts": ["mfa"]}}},
	"t-bad-age": {"authentication": {"tenant": {"contexts": [], "max_age_s": "1h"}}},
	"t-bad-requirement": {"authentication": {"routes": {"chat.completions": ["c1"]}}},
	"t-bad-section": {"authentication": "c1"},
}

_input(tenant_id, principal, request) := {
	"principal": object.union({"tenant_id": tenant_id, "object_id": "o1", "iat": 2000}, principal),
	"request": object.union({"route": "chat.completions", "model": "m", "data_classification": "internal"}, request),
}

_authn(tenant_id, principal, request) := result if {
	result := {
		"contexts": authn.contexts, "missing": authn.missing, "max_age_s": authn.max_age_s,
		"revoked": authn.revoked, "challenge": authn.challenge, "deny": authn.deny,
	}
		with input as _input(tenant_id, principal, request)
		with data.tenants as _tenants
}

test_allow_a_tenant_without_requirements_needs_nothing if {
	a := _authn("t-plain", {}, {"data_classification": "restricted"})
	a.contexts == []
	a.missing == []
	a.max_age_s == 0
	a.revoked == false
	a.deny == set()
}

test_deny_restricted_data_needs_its_context_and_a_recent_sign_in if {
	a := _authn("t-ca", {"acrs": ["c9"]}, {"data_classification": "restricted"})
	a.contexts == ["c1", "c9"]
	a.missing == ["c1"]
	a.max_age_s == 3600
	a.deny == {"this request needs authentication context c1"}
}

test_allow_a_token_with_every_context_is_not_denied if {
	a := _authn("t-ca", {"acrs": ["c1", "c9", "c42"]}, {"data_classification": "restricted"})
	a.missing == []
	a.deny == set()
}

test_deny_per_model_and_per_route_contexts_add_up if {
	a := _authn("t-ca", {}, {"model": "m-secure", "route": "responses"})
	a.contexts == ["c2", "c3", "c9"]
	a.missing == ["c2", "c3", "c9"]
	a.max_age_s == 7200
	count(a.deny) == 3
}

test_allow_the_shortest_max_age_wins if {
	a := _authn("t-ca", {"acrs": ["c1", "c2", "c9"]}, {"model": "m-secure", "data_classification": "restricted"})
	a.max_age_s == 3600
	a.deny == set()
}

test_allow_challenge_only_for_a_client_that_declared_cp1 if {
	_authn("t-ca", {"xms_cc": ["cp1"]}, {}).challenge == true
	_authn("t-ca", {"xms_cc": ["cp2"]}, {}).challenge == false
	_authn("t-ca", {}, {}).challenge == false
}

test_deny_a_revoked_object_id if {
	a := _authn("t-ca", {"object_id": "o-revoked", "acrs": ["c9"]}, {})
	a.revoked == true
	a.deny == {"the caller's token has been revoked"}
}

test_deny_a_revoked_session if {
	_authn("t-ca", {"sid": "s-revoked", "acrs": ["c9"]}, {}).revoked == true
	_authn("t-ca", {"sid": "s-other", "acrs": ["c9"]}, {}).revoked == false
}

test_deny_a_token_issued_before_the_tenant_cutoff if {
	_authn("t-ca", {"iat": 999, "acrs": ["c9"]}, {}).revoked == true
	_authn("t-ca", {"iat": 1000, "acrs": ["c9"]}, {}).revoked == false
}

test_deny_a_cutoff_that_is_no_number_revokes_every_token if {
	# Fails closed, and never by comparing a number with a string (engines may order them differently).
	_authn("t-bad-cutoff", {"iat": 5}, {}).revoked == true
}

test_allow_other_principals_of_a_revoking_tenant_are_not_revoked if {
	_authn("t-ca", {"acrs": ["c9"]}, {}).revoked == false
}

test_deny_requirement_data_of_the_wrong_shape_leaves_no_decision if {
	# No contexts and no max_age: the decision is undefined and its default denies, in both engines.
	every tenant_id in ["t-bad-contexts", "t-bad-context-id", "t-bad-age", "t-bad-requirement", "t-bad-section"] {
		not _has_contexts(tenant_id)
	}
}

_has_contexts(tenant_id) if {
	authn.contexts with input as _input(tenant_id, {}, {}) with data.tenants as _tenants
}

test_deny_a_revocation_list_that_is_no_list_revokes_every_token if {
	_authn("t-bad-list", {"object_id": "o2"}, {}).revoked == true
}

test_allow_a_claim_list_of_the_wrong_shape_counts_as_none if {
	a := _authn("t-ca", {"acrs": "c9", "xms_cc": "cp1"}, {})
	a.missing == ["c9"]
	a.challenge == false
}
