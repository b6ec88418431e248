package tenantgate.tools_test

import data.tenantgate.tools

_d1 := "sha256:1111111111111111111111111111111111111111111111111111111111111111"

_d2 := "sha256:2222222222222222222222222222222222222222222222222222222222222222"

_tenants := {
	"t1": {
		"enabled": true,
		"logging": {"content": "none", "redact": []},
		"mcp": {"servers": {"dev": {
			"list": {"calls_per_minute": 100, "concurrency": 3, "max_result_bytes": 4096},
			"tools": {
				"echo": {
					"allow": true, "calls_per_minute": 5, "concurrency": 1, "max_result_bytes": 100,
					"arguments": {"text": {"max_length": 5}, "mode": {"enum": ["loud", "quiet"]}},
				},
				"count": {"allow": true, "digests": [_d2], "cache": true},
				"wipe": {"allow": false},
			},
		}}},
	},
	"t2": {"enabled": false, "mcp": {"servers": {"dev": {"tools": {"echo": {"allow": true}}}}}},
	"t3": {"enabled": true, "logging": {"content": "redacted", "redact": ["/arguments/secret"]}, "mcp": {"servers": {"dev": {"tools": {"echo": {"allow": true}}}}}},
	"t4": {"enabled": true},
}

_user := {"tenant_id": "t1", "object_id": "o1", "idtyp": "user", "scopes": ["Tools.Invoke"], "roles": []}

_call(principal, name, digest, recorded, arguments) := {
	"principal": principal, "server": "dev", "method": "tools/call",
	"tool": {"name": name, "digest": digest, "recorded_digest": recorded, "arguments": arguments},
}

_decide(document) := d if {
	d := tools.decision with input as document with data.tenants as _tenants
}

_listing(principal) := {
	"principal": principal, "server": "dev", "method": "tools/list",
	"tools": [
		{"name": "echo", "digest": _d1, "recorded_digest": _d1},
		{"name": "count", "digest": _d1, "recorded_digest": _d1},
		{"name": "wipe", "digest": _d1, "recorded_digest": _d1},
		{"name": "unknown", "digest": _d1, "recorded_digest": _d1},
	],
}

test_allow_call_with_the_tools_budget if {
	d := _decide(_call(_user, "echo", _d1, _d1, {"text": "hi", "mode": "loud"}))
	d.allow == true
	d.reasons == []
	d.tool == {"calls_per_minute": 5, "concurrency": 1, "max_result_bytes": 100, "cache": false}
	d.logging == {"content": "none", "redact": ["/arguments", "/result"]}
}

test_allow_call_with_default_budget_and_pinned_digest if {
	d := _decide(_call(_user, "count", _d2, _d1, {}))
	d.allow == true
	d.tool == {"calls_per_minute": 60, "concurrency": 4, "max_result_bytes": 65536, "cache": true}
}

test_allow_list_shows_only_allowed_accepted_tools if {
	d := _decide(_listing(_user))
	d.allow == true
	d.listed == ["echo"] # count's pin is another digest, wipe is denied, unknown is not named
	d.tool == {"calls_per_minute": 100, "concurrency": 3, "max_result_bytes": 4096, "cache": false}
}

test_allow_redacted_logging_keeps_the_tenants_pointers if {
	p := object.union(_user, {"tenant_id": "t3"})
	d := _decide(_call(p, "echo", _d1, _d1, {"text": "anything at all"}))
	d.allow == true
	d.logging == {"content": "redacted", "redact": ["/arguments/secret"]}
}

test_deny_tool_the_policy_denies if {
	d := _decide(_call(_user, "wipe", _d1, _d1, {}))
	d.allow == false
	d.reasons == ["the tool is not allowed for this tenant"]
	d.tool.calls_per_minute == 0
}

test_deny_tool_not_named if {
	d := _decide(_call(_user, "unknown", _d1, _d1, {}))
	d.reasons == ["the tool is not allowed for this tenant"]
}

test_deny_changed_definition_until_pinned if {
	d := _decide(_call(_user, "echo", _d2, _d1, {}))
	d.allow == false
	d.reasons == ["the tool's definition is not the one this tenant's policy accepts"]
}

test_deny_digest_other_than_the_pinned_one if {
	d := _decide(_call(_user, "count", _d1, _d1, {}))
	d.reasons == ["the tool's definition is not the one this tenant's policy accepts"]
}

test_deny_unknown_tenant if {
	d := _decide(_call(object.union(_user, {"tenant_id": "nobody"}), "echo", _d1, _d1, {}))
	d.reasons == ["the caller's tenant is not registered with this gateway"]
	d.listed == []
}

test_deny_suspended_tenant if {
	d := _decide(_call(object.union(_user, {"tenant_id": "t2"}), "echo", _d1, _d1, {}))
	"the caller's tenant is suspended" in d.reasons
}

test_deny_server_not_available if {
	d := _decide(_listing(object.union(_user, {"tenant_id": "t4"})))
	d.reasons == ["this MCP server is not available to the tenant"]
	d.listed == []
}

test_deny_user_token_without_scope if {
	d := _decide(_listing(object.union(_user, {"scopes": ["Inference.Invoke"]})))
	d.reasons == ["the delegated token lacks the Tools.Invoke scope"]
}

test_deny_app_token_without_role if {
	d := _decide(_listing(object.union(_user, {"idtyp": "app", "scopes": [], "roles": ["Inference.Invoke.All"]})))
	d.reasons == ["the app-only token lacks the Tools.Invoke.All app role"]
}

test_allow_app_token_with_role if {
	d := _decide(_listing(object.union(_user, {"idtyp": "app", "scopes": [], "roles": ["Tools.Invoke.All"]})))
	d.allow == true
}

test_deny_unknown_token_type if {
	d := _decide(_listing(object.union(_user, {"idtyp": "robot"})))
	d.reasons == ["the token type is not recognised"]
}

test_deny_no_object_id if {
	d := _decide(_listing(object.union(_user, {"object_id": ""})))
	d.reasons == ["the token carries no object id"]
}

test_deny_other_methods if {
	d := _decide(object.union(_listing(_user), {"method": "resources/list"}))
	d.reasons == ["the method is not one this policy governs"]
}

test_deny_example_northwind_delete_repository if {
	p := object.union(_user, {"tenant_id": "c1a9e3f5-2d4b-4c6e-8f0a-b2c4d6e8f0a1"})
	denied := object.union(_call(p, "delete_repository", _d1, _d1, {"name": "x"}), {"server": "devtools"})
	d := tools.decision with input as denied with data.tenants as data.data.tenants
	d.reasons == ["the tool is not allowed for this tenant"]
}

test_allow_example_northwind_echo if {
	p := object.union(_user, {"tenant_id": "c1a9e3f5-2d4b-4c6e-8f0a-b2c4d6e8f0a1"})
	allowed := object.union(_call(p, "echo", _d1, _d1, {"text": "hi"}), {"server": "devtools"})
	d := tools.decision with input as allowed with data.tenants as data.data.tenants
	d.allow == true
	d.tool.calls_per_minute == 60
}
