# METADATA
# title: Tool arguments
# description: |
#   Which of a tools/call's arguments the tenant's policy refuses (data.tenantgate.tools.arguments.denials),
#   asked for each call that the tools decision allows. A tool whose data names `arguments` takes only
#   the arguments named there, each within its constraints (enum, max_length); a tool without them
#   takes any. Kept apart from the tools decision so that only this small set is evaluated per call
#   with the arguments as input; each reason names the argument, never its value.
package tenantgate.tools.arguments

# The tool's rule (false when the tenant has none). One object.get over the path: regorus
# evaluates a chain of computed indexes (tenants[...].servers[...].tools[...]) about three times
# slower, and this package runs on every call (docs/policy-reference.md, "Evaluation cost").
_rule := object.get(
	data.tenants,
	[input.principal.tenant_id, "mcp", "servers", input.server, "tools", input.tool.name],
	false,
)

# METADATA
# description: One reason per argument outside the tool's constraints; empty when all are within them.
denials contains sprintf("the argument %s is not allowed by this tenant's policy", [name]) if {
	input.method == "tools/call"
	_rule.arguments
	some name, value in object.get(input.tool, "arguments", {})
	not _argument_ok(name, value)
}

_argument_ok(name, value) if {
	constraint := _rule.arguments[name]
	_enum_ok(constraint, value)
	_length_ok(constraint, value)
}

_enum_ok(constraint, _) if not constraint.enum

_enum_ok(constraint, value) if value in constraint.enum

_length_ok(constraint, _) if not constraint.max_length

_length_ok(constraint, value) if {
	is_string(value)
	count(value) <= constraint.max_length
}
