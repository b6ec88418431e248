package tenantgate.responses_test

import data.tenantgate.responses

_tenants := {
	"t1": {"responses": {"store": true, "retention_days": 7}},
	"t2": {"responses": {"store": false}},
	"t3": {},
	"t4": {"responses": {"store": "yes", "retention_days": 5000}},
	"t5": {"responses": {"store": true}},
}

_input(tenant, route, classification) := {
	"principal": {"tenant_id": tenant},
	"request": {"route": route, "data_classification": classification},
}

_store(tenant, route, classification) := value if {
	value := responses.store with input as _input(tenant, route, classification) with data.tenants as _tenants
}

_days(tenant) := value if {
	value := responses.retention_days with input as _input(tenant, "responses", "internal")
		with data.tenants as _tenants
}

test_allow_store_when_the_tenant_turns_it_on if {
	_store("t1", "responses", "confidential") == true
	_days("t1") == 7
	"responses: stored, encrypted, for 7 days" in responses.notes with input as _input("t1", "responses", "internal")
		with data.tenants as _tenants
}

test_allow_store_with_the_default_retention if {
	_store("t5", "responses", "internal") == true
	_days("t5") == 30
}

test_deny_store_for_restricted_data if {
	_store("t1", "responses", "restricted") == false
	"restricted data: responses are not stored" in responses.notes with input as _input("t1", "responses", "restricted")
		with data.tenants as _tenants
}

test_deny_store_on_other_routes if {
	_store("t1", "chat.completions", "internal") == false
}

test_deny_store_by_default if {
	_store("t2", "responses", "internal") == false
	_store("t3", "responses", "internal") == false
	_store("unknown", "responses", "internal") == false
}

test_deny_store_unless_exactly_true_and_retention_out_of_range_is_the_default if {
	_store("t4", "responses", "internal") == false
	_days("t4") == 30
}
