# METADATA
# title: Limits
# description: |
#   Token and request budgets from the tenant's data. The requested max_tokens is
#   clamped to the tenant's limit. The context window is the tenant's max_context_tokens:
#   the gateway clamps max_tokens again to what that window (and the model's) leaves
#   after the prompt, and refuses a prompt that leaves no room (400
#   context_length_exceeded). No rule here reads the prompt's length, so a request's
#   decision is cached whatever its prompt (docs/policy-reference.md, "What the decision
#   cache keys on").
#   Embeddings generate nothing: their max_tokens is the tenant's limit, unused, and
#   their inputs (each cut at the encoder's own length) count against the token budget.
package tenantgate.limits

# The caller's tenant record, shared by the decision's packages (policies/tenant).
import data.tenantgate.tenant.record as _tenant

_limits := _tenant.limits

_requested := object.get(input.request, "max_tokens", null)

_embeddings if input.request.route == "embeddings"

_wanted := _limits.max_tokens if _requested == null

_wanted := _requested if _requested != null

max_tokens := _limits.max_tokens if _embeddings

max_tokens := min([_wanted, _limits.max_tokens]) if {
	not _embeddings
	_positive_integer(_wanted)
}

# METADATA
# description: |
#   The tenant's budgets as an allowed decision carries them: every figure below but
#   max_tokens (which depends on the request), in one object. decision.rego reads this one
#   rule rather than twelve, because regorus spends some microseconds on every rule it
#   evaluates. The figures' rules below read it too, so each is defined once; they are
#   undefined together when the tenant's limits lack a figure (the decision is then too).
budgets := {
	"max_context_tokens": tenant_limits.max_context_tokens,
	"tokens_per_minute": tenant_limits.tokens_per_minute,
	"requests_per_minute": tenant_limits.requests_per_minute,
	"kv_blocks": tenant_limits.kv_blocks,
	"priority": tenant_limits.priority,
	"principal_requests_per_minute": object.get(tenant_limits, "principal_requests_per_minute", tenant_limits.requests_per_minute),
	"principal_tokens_per_minute": object.get(tenant_limits, "principal_tokens_per_minute", tenant_limits.tokens_per_minute),
	"concurrent_requests": object.get(tenant_limits, "concurrent_requests", 64),
	"max_choices": object.get(tenant_limits, "max_choices", 4),
	"max_schema_bytes": object.get(tenant_limits, "max_schema_bytes", 16384),
	"max_schema_depth": object.get(tenant_limits, "max_schema_depth", 16),
	"fail_open": object.get(tenant_limits, "fail_open", false),
} if {
	tenant_limits := _limits
}

max_context_tokens := budgets.max_context_tokens

tokens_per_minute := budgets.tokens_per_minute

requests_per_minute := budgets.requests_per_minute

kv_blocks := budgets.kv_blocks

priority := budgets.priority

# Per principal within the tenant; the tenant's own figures unless the tenant sets them.
principal_requests_per_minute := budgets.principal_requests_per_minute

principal_tokens_per_minute := budgets.principal_tokens_per_minute

# Requests of the tenant in flight at once; 64 unless the tenant sets it.
concurrent_requests := budgets.concurrent_requests

# The most choices (n) one request may ask for (4 unless the tenant sets it); each is charged
# max_tokens, and all share the prompt's KV. The gateway refuses a larger n with 400 rather
# than return fewer.
max_choices := budgets.max_choices

# Structured outputs: the largest JSON schema a request may ask for (bytes of its compact JSON,
# 16384 unless set) and its deepest nesting (objects and arrays within one another, 16 unless
# set); the gateway refuses more with a 400.
max_schema_bytes := budgets.max_schema_bytes

max_schema_depth := budgets.max_schema_depth

# Whether the tenant is served when the quota store is unreachable (unaccounted); off unless set.
fail_open := budgets.fail_open

deny contains "max_tokens must be a positive integer" if {
	_requested != null
	not _positive_integer(_requested)
}

notes contains "max_tokens clamped to the tenant's limit" if {
	_requested != null
	_requested > max_tokens
}

_positive_integer(n) if {
	is_number(n)
	n >= 1
	floor(n) == n
}
