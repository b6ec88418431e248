# METADATA
# title: Limits
# description: |
#   Token and request budgets from the tenant's data. The requested max_tokens is
#   clamped to the tenant's limit and to what the context window leaves after the
#   prompt. Embeddings generate nothing: their max_tokens is the tenant's limit, unused,
#   and their inputs (each cut at the encoder's own length) count against the token
#   budget, not a context window.
package tenantgate.limits

# The caller's tenant record, shared by the decision's packages (policies/tenant).
import data.tenantgate.tenant.record as _tenant

_limits := _tenant.limits

_prompt_tokens := object.get(input.request, "prompt_tokens", 0)

_requested := object.get(input.request, "max_tokens", null)

_embeddings if input.request.route == "embeddings"

_wanted := _limits.max_tokens if _requested == null

_wanted := _requested if _requested != null

max_tokens := _limits.max_tokens if {
	_embeddings
	_non_negative_integer(_prompt_tokens)
}

max_tokens := min([_wanted, _limits.max_tokens, _limits.max_context_tokens - _prompt_tokens]) if {
	not _embeddings
	_positive_integer(_wanted)
	_non_negative_integer(_prompt_tokens)
}

max_context_tokens := _limits.max_context_tokens

tokens_per_minute := _limits.tokens_per_minute

requests_per_minute := _limits.requests_per_minute

kv_blocks := _limits.kv_blocks

priority := _limits.priority

# Per principal within the tenant; the tenant's own figures unless the tenant sets them.
principal_requests_per_minute := object.get(_limits, "principal_requests_per_minute", _limits.requests_per_minute)

principal_tokens_per_minute := object.get(_limits, "principal_tokens_per_minute", _limits.tokens_per_minute)

concurrent_requests := object.get(_limits, "concurrent_requests", 64)

# The most choices (n) one request may ask for; each is charged max_tokens, and all share
# the prompt's KV. The gateway refuses a larger n with 400 rather than return fewer.
max_choices := object.get(_limits, "max_choices", 4)

# Structured outputs: the largest JSON schema a request may ask for (bytes of its compact JSON) and
# its deepest nesting (objects and arrays within one another); the gateway refuses more with a 400.
max_schema_bytes := object.get(_limits, "max_schema_bytes", 16384)

max_schema_depth := object.get(_limits, "max_schema_depth", 16)

# Whether the tenant is served when the quota store is unreachable (unaccounted); off unless set.
fail_open := object.get(_limits, "fail_open", false)

deny contains "max_tokens must be a positive integer" if {
	_requested != null
	not _positive_integer(_requested)
}

deny contains "prompt_tokens must be a non-negative integer" if {
	not _non_negative_integer(_prompt_tokens)
}

# The gateway answers this deny alone as 400 context_length_exceeded, with both counts.
deny contains sprintf(
	"the prompt leaves no room in this tenant's context window of %d tokens",
	[_limits.max_context_tokens],
) if {
	not _embeddings
	_prompt_tokens >= _limits.max_context_tokens
}

notes contains "max_tokens clamped to the tenant's limit or context window" if {
	_requested != null
	_requested > max_tokens
}

_positive_integer(n) if {
	_non_negative_integer(n)
	n >= 1
}

_non_negative_integer(n) if {
	is_number(n)
	n >= 0
	floor(n) == n
}
