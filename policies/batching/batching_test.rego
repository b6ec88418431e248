package tenantgate.batching_test

import data.tenantgate.batching

_tenants := {
	"t-shared": {"isolation": "shared", "deterministic": false},
	"t-repro": {"isolation": "tenant", "deterministic": true},
	"t-alone": {"isolation": "exclusive"},
	"t-no-spec": {"isolation": "shared", "deterministic": false, "speculative": false},
}

_batching(tenant_id, classification) := result if {
	result := {
		"isolation": batching.isolation, "deterministic": batching.deterministic,
		"speculative": batching.speculative, "notes": batching.notes,
	}
		with input as {"principal": {"tenant_id": tenant_id}, "request": {"data_classification": classification}}
		with data.tenants as _tenants
}

test_allow_tenant_isolation_default if {
	b := _batching("t-shared", "internal")
	b.isolation == "shared"
	b.deterministic == false
	b.notes == set()
}

test_allow_deterministic_lane_for_reproducible_tenant if {
	b := _batching("t-repro", "confidential")
	b.isolation == "tenant"
	b.deterministic == true
}

test_deny_deterministic_lane_when_tenant_omits_it if {
	_batching("t-alone", "internal").deterministic == false
}

test_deny_shared_batches_for_restricted_data if {
	b := _batching("t-shared", "restricted")
	b.isolation == "exclusive"
	b.notes == {"restricted data: exclusive batch isolation"}
}

test_deny_restricted_note_when_already_exclusive if {
	b := _batching("t-alone", "restricted")
	b.isolation == "exclusive"
	b.notes == set()
}

test_deny_sharing_for_unknown_tenant if {
	b := _batching("nobody", "public")
	b.isolation == "exclusive"
	b.deterministic == false
}

test_allow_speculation_by_default if {
	_batching("t-shared", "internal").speculative == true
	_batching("t-alone", "restricted").speculative == true
}

test_deny_speculation_in_the_deterministic_lane if {
	_batching("t-repro", "confidential").speculative == false
}

test_deny_speculation_for_unknown_tenant if {
	_batching("nobody", "public").speculative == false
}

test_deny_speculation_when_tenant_turns_it_off if {
	_batching("t-no-spec", "internal").speculative == false
}
