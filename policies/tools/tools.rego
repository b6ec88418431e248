# METADATA
# title: Tools
# description: |
#   Which MCP tools a caller may list and call on which server, and with what budget: the one
#   document the gateway asks for per tools/list and per tools/call (data.tenantgate.tools.decision).
#   A tool is allowed only when the tenant's data allows it by name under the server and its
#   definition's digest is accepted (pinned in the data, or unchanged since the gateway first saw
#   it when nothing is pinned). A call's arguments are judged apart, by
#   data.tenantgate.tools.arguments.denials (arguments.rego): this decision never reads them, so the
#   gateway's decision cache keys it on the caller, server and tool alone.
#   Default deny; every reason is safe to show the caller.
package tenantgate.tools

# METADATA
# description: The delegated permission a user (delegated) token must carry to use tools.
required_scope := "Tools.Invoke"

# METADATA
# description: The application role an app-only token must carry to use tools.
required_app_role := "Tools.Invoke.All"

# Anything this policy cannot compute ends here: denied, nothing listed, nothing logged.
default decision := {
	"allow": false,
	"reasons": ["the policy could not reach a decision for this request"],
	"listed": [],
	"tool": {"calls_per_minute": 0, "concurrency": 0, "max_result_bytes": 0, "cache": false},
	"logging": {"content": "none", "redact": ["/arguments", "/result"]},
}

decision := _allowed if count(deny) == 0

decision := _denied if count(deny) > 0

_tenant := data.tenants[input.principal.tenant_id]

_server := _tenant.mcp.servers[input.server]

_call if input.method == "tools/call"

_rule := _server.tools[input.tool.name] if _call

deny contains "the caller's tenant is not registered with this gateway" if not _tenant

deny contains "the caller's tenant is suspended" if _tenant.enabled == false

deny contains "the token carries no object id" if not _has_object_id

deny contains "this MCP server is not available to the tenant" if {
	_tenant
	not _server
}

deny contains "the app-only token lacks the Tools.Invoke.All app role" if {
	input.principal.idtyp == "app"
	not _has_app_role
}

deny contains "the delegated token lacks the Tools.Invoke scope" if {
	input.principal.idtyp == "user"
	not _has_scope
}

deny contains "the token type is not recognised" if not _token_type_known

deny contains "the method is not one this policy governs" if not _method_known

deny contains "the tool is not allowed for this tenant" if {
	_server
	_call
	not _called_tool_allowed
}

deny contains "the tool's definition is not the one this tenant's policy accepts" if {
	_server
	_call
	_called_tool_allowed
	not _called_digest_accepted
}

# Helper rules rather than `not f(...)` above: OPA makes `not f(x)` undefined when x is (a call
# without a digest would then be allowed there and denied in regorus), where `not` of a rule is not.
_called_tool_allowed if _tool_allowed(input.tool.name)

_called_digest_accepted if _digest_accepted(input.tool.name, input.tool.digest, input.tool.recorded_digest)

_has_object_id if {
	is_string(input.principal.object_id)
	input.principal.object_id != ""
}

_has_app_role if required_app_role in input.principal.roles

_has_scope if required_scope in input.principal.scopes

_token_type_known if input.principal.idtyp in {"user", "app"}

_method_known if input.method in {"tools/list", "tools/call"}

_tool_allowed(name) if _server.tools[name].allow == true

# Pinned digests are the only ones accepted; without pins, the definition the gateway first saw.
_digest_accepted(name, digest, _) if digest in _server.tools[name].digests

_digest_accepted(name, digest, recorded) if {
	not _pinned(name)
	digest == recorded
}

_pinned(name) if _server.tools[name].digests

# METADATA
# description: The tools a tools/list shows; a denied tool, or one whose definition is not accepted, is withheld.
listed contains tool.name if {
	input.method == "tools/list"
	some tool in input.tools
	_tool_allowed(tool.name)
	_digest_accepted(tool.name, tool.digest, tool.recorded_digest)
}

# A call's budget is its tool's; a listing's is the server's.
_limits := _rule if _call

_limits := object.get(_server, "list", {}) if input.method == "tools/list"

_logging := object.get(_tenant, "logging", {})

_content := object.get(_logging, "content", "none")

# The tenant's own pointers. A value that is not a list leaves them (and so the decision) undefined,
# which denies: OPA iterates a number or a string as nothing where regorus refuses to, and neither
# may record a call with fewer redactions than the tenant asked for (policies/logging reads it alike).
_tenant_redact := {p | some p in pointers} if {
	pointers := object.get(_logging, "redact", [])
	is_array(pointers)
}

# With content "none" nothing of a call's arguments or result reaches a record.
_redact := _tenant_redact | {"/arguments", "/result"} if _content == "none"

_redact := _tenant_redact if _content != "none"

_allowed := {
	"allow": true,
	"reasons": [],
	"listed": sort(listed),
	"tool": {
		"calls_per_minute": object.get(_limits, "calls_per_minute", 60),
		"concurrency": object.get(_limits, "concurrency", 4),
		"max_result_bytes": object.get(_limits, "max_result_bytes", 65536),
		"cache": object.get(_limits, "cache", false),
	},
	"logging": {
		"content": _content,
		"redact": sort(_redact),
	},
}

_denied := {
	"allow": false,
	"reasons": sort(deny),
	"listed": [],
	"tool": {"calls_per_minute": 0, "concurrency": 0, "max_result_bytes": 0, "cache": false},
	"logging": {"content": "none", "redact": ["/arguments", "/result"]},
}
