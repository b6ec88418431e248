package tenantgate.decision_test

import data.tenantgate

# The example tenants shipped beside the policies; OPA loads policies/data/*.json at data.data.
_example_tenants := data.data.tenants

_example_segments := data.data.platform_segments

# Each policies/samples/<name>.json holds {"<name>": {"description", "input", "expected"}}.
_samples := data.samples

_decide(sample) := decision if {
	decision := tenantgate.decision with input as sample.input with data.tenants as _example_tenants
		with data.platform_segments as _example_segments
}

_mismatched contains name if {
	some name, sample in _samples
	_decide(sample) != sample.expected
}

test_allow_samples_are_loaded if {
	count(_samples) >= 10
	count([name | some name, _ in _samples; startswith(name, "allow_")]) >= 3
	count([name | some name, _ in _samples; startswith(name, "deny_")]) >= 3
}

test_allow_every_sample_matches_its_expected_decision if {
	print("samples whose decision differs from expected:", _mismatched)
	count(_mismatched) == 0
}

test_allow_sample_names_match_their_expectation if {
	every name, sample in _samples {
		sample.expected.allow == startswith(name, "allow_")
	}
}

test_deny_every_deny_carries_a_reason if {
	every _, sample in _samples {
		_carries_reason(_decide(sample))
	}
}

_carries_reason(decision) if decision.allow == true

_carries_reason(decision) if {
	decision.allow == false
	count(decision.reasons) > 0
}

test_deny_empty_input if {
	d := tenantgate.decision with input as {} with data.tenants as _example_tenants
	d.allow == false
	"the caller's tenant is not registered with this gateway" in d.reasons
	d.cache == {"scope": "none", "namespace": "", "segments": []}
	d.batching.isolation == "exclusive"
	d.limits.max_tokens == 0
}

test_deny_when_a_field_cannot_be_computed if {
	broken := json.remove(_example_tenants, ["8d4e2b10-7c6f-4a91-b3d5-e6f708192a3b/limits/kv_blocks"])
	d := tenantgate.decision with input as _samples.allow_standard_app_token.input with data.tenants as broken
	d.allow == false
	d.reasons == ["the policy could not reach a decision for this request"]
}

test_deny_when_the_authentication_data_cannot_be_read if {
	broken := object.union(_example_tenants, {"c1a9e3f5-2d4b-4c6e-8f0a-b2c4d6e8f0a1": {"authentication": {"tenant": {"contexts": "c1"}}}})
	d := tenantgate.decision with input as _samples.allow_free_public_shared_cache.input with data.tenants as broken
	d.allow == false
	d.reasons == ["the policy could not reach a decision for this request"]
}
