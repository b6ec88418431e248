package tenantgate.tools.arguments_test

import data.tenantgate.tools.arguments

_tenants := {"t1": {"enabled": true, "mcp": {"servers": {"dev": {"tools": {
	"echo": {"allow": true, "arguments": {"text": {"max_length": 5}, "mode": {"enum": ["loud", "quiet"]}}},
	"free": {"allow": true},
}}}}}}

_call(name, args) := {
	"principal": {"tenant_id": "t1", "object_id": "o1", "idtyp": "user", "scopes": ["Tools.Invoke"], "roles": []},
	"server": "dev", "method": "tools/call",
	"tool": {"name": name, "digest": "d", "recorded_digest": "d", "arguments": args},
}

_denials(document) := d if {
	d := arguments.denials with input as document with data.tenants as _tenants
}

test_arguments_within_their_constraints_are_not_denied if {
	_denials(_call("echo", {"text": "hi", "mode": "loud"})) == set()
}

test_deny_argument_too_long if {
	_denials(_call("echo", {"text": "far too long"})) == {"the argument text is not allowed by this tenant's policy"}
}

test_deny_argument_outside_its_enum_and_unknown_argument if {
	_denials(_call("echo", {"mode": "shout", "extra": 1})) == {
		"the argument extra is not allowed by this tenant's policy",
		"the argument mode is not allowed by this tenant's policy",
	}
}

test_deny_argument_of_the_wrong_type if {
	_denials(_call("echo", {"text": 12345})) == {"the argument text is not allowed by this tenant's policy"}
}

test_a_tool_without_constraints_takes_any_arguments if {
	_denials(_call("free", {"anything": "x"})) == set()
}

test_a_listing_has_no_argument_denials if {
	_denials(object.union(_call("echo", {"extra": 1}), {"method": "tools/list"})) == set()
}

_northwind_echo(text) := object.union(_call("echo", {"text": text}), {
	"server": "devtools",
	"principal": {"tenant_id": "c1a9e3f5-2d4b-4c6e-8f0a-b2c4d6e8f0a1"},
})

test_the_example_northwind_echo_takes_texts_up_to_2000_characters if {
	long := concat("", ["x" | some _ in numbers.range(1, 2001)])
	arguments.denials == set() with input as _northwind_echo("hi") with data.tenants as data.data.tenants
	arguments.denials == {"the argument text is not allowed by this tenant's policy"} with input as _northwind_echo(long)
		with data.tenants as data.data.tenants
}
