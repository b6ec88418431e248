package tenantgate.tenant_test

import data.tenantgate.tenant

test_allow_the_record_is_the_callers_tenant if {
	tenant.record == {"name": "t1"} with input as {"principal": {"tenant_id": "t1"}}
		with data.tenants as {"t1": {"name": "t1"}, "t2": {"name": "t2"}}
}

test_deny_an_unregistered_tenant_has_no_record if {
	not tenant.record with input as {"principal": {"tenant_id": "t3"}}
		with data.tenants as {"t1": {"name": "t1"}}
}
