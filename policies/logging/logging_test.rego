package tenantgate.logging_test

import data.tenantgate.logging

_tenants := {
	"t-redacted": {"logging": {"content": "redacted", "retention_days": 90, "redact": ["/request/user"]}},
	"t-none": {"logging": {"content": "none", "retention_days": 7, "redact": []}},
	"t-named": {"name": "Named Ltd", "logging": {"content": "none", "retention_days": 7, "redact": [], "name_in_metrics": true}},
	"t-unnamed": {"name": "Unnamed Ltd", "logging": {"content": "none", "retention_days": 7, "redact": []}},
	"t-odd-name": {"name": "Odd \"Name\" {Ltd}", "logging": {"content": "none", "retention_days": 7, "redact": [], "name_in_metrics": true}},
}

_logging(tenant_id, classification) := result if {
	result := {
		"content": logging.content,
		"redact": logging.redact,
		"retention_days": logging.retention_days,
		"notes": logging.notes,
	} with input as {"principal": {"tenant_id": tenant_id}, "request": {"data_classification": classification}}
		with data.tenants as _tenants
}

_base := [
	"/request/headers/authorization",
	"/request/input",
	"/request/messages",
	"/request/prompt",
	"/response/choices",
]

test_allow_redacted_content_when_tenant_opts_in if {
	l := _logging("t-redacted", "confidential")
	l.content == "redacted"
	l.retention_days == 90
	l.redact == ["/request/headers/authorization", "/request/user"]
	l.notes == set()
}

test_deny_restricted_data_keeps_every_content_pointer if {
	l := _logging("t-redacted", "restricted")
	l.redact == sort(array.concat(_base, ["/request/user"]))
}

test_deny_content_by_default if {
	l := _logging("t-none", "internal")
	l.content == "none"
	l.redact == _base
	l.retention_days == 7
}

test_deny_content_for_restricted_data if {
	l := _logging("t-redacted", "restricted")
	l.content == "none"
	l.notes == {"restricted data: content logging off"}
}

test_deny_content_for_unknown_tenant if {
	l := _logging("nobody", "public")
	l.content == "none"
	l.redact == _base
	l.retention_days == 30
}

test_deny_base_redactions_cannot_be_dropped if {
	every pointer in _base {
		pointer in _logging("t-none", "public").redact
	}
	"/request/headers/authorization" in _logging("t-redacted", "public").redact
}

test_allow_metrics_name_when_tenant_data_allows_it if {
	logging.metrics_name == "Named Ltd" with input as {"principal": {"tenant_id": "t-named"}, "request": {}}
		with data.tenants as _tenants
}

test_deny_metrics_name_without_name_in_metrics if {
	logging.metrics_name == "" with input as {"principal": {"tenant_id": "t-unnamed"}, "request": {}}
		with data.tenants as _tenants
}

test_deny_metrics_name_that_cannot_be_a_label if {
	logging.metrics_name == "" with input as {"principal": {"tenant_id": "t-odd-name"}, "request": {}}
		with data.tenants as _tenants
}

test_deny_a_redact_list_that_is_no_list_leaves_redact_undefined if {
	# The decision is then undefined, so denied: fewer redactions than the tenant asked for are never served.
	every bad in [5, "/request/user", true, {"pointer": "/request/user"}] {
		not logging.redact with input as {"principal": {"tenant_id": "t"}, "request": {"data_classification": "public"}}
			with data.tenants as {"t": {"logging": {"content": "redacted", "redact": bad}}}
	}
}

test_allow_a_tenant_without_a_redact_list_keeps_the_base_alone if {
	l := logging.redact with input as {"principal": {"tenant_id": "t"}, "request": {"data_classification": "public"}}
		with data.tenants as {"t": {"logging": {"content": "none"}}}
	l == _base
}
