# METADATA
# title: Decision
# description: |
#   The one document the gateway asks for per request (data.tenantgate.decision).
#   Default deny: a request is allowed only when no package denies it and every
#   field could be computed; a deny carries its reasons and the safest settings.
package tenantgate

import data.tenantgate.authn
import data.tenantgate.authz
import data.tenantgate.batching
import data.tenantgate.cache
import data.tenantgate.limits
import data.tenantgate.logging
import data.tenantgate.prompt
import data.tenantgate.responses

# Anything this policy cannot compute ends here: denied, nothing shared, nothing logged.
default decision := {
	"allow": false,
	"reasons": ["the policy could not reach a decision for this request"],
	"cache": {"scope": "none", "namespace": "", "segments": []},
	"batching": {"isolation": "exclusive", "deterministic": false, "speculative": false},
	"logging": {
		"content": "none",
		"redact": [
			"/request/headers/authorization",
			"/request/input",
			"/request/messages",
			"/request/prompt",
			"/response/choices",
		],
		"retention_days": 30,
		"metrics_name": "",
	},
	"prompt": {"special_tokens": false},
	"responses": {"store": false, "retention_days": 30},
	"authentication": {"contexts": [], "missing": [], "max_age_s": 0, "revoked": false, "challenge": false},
	"limits": {
		"max_tokens": 0,
		"max_context_tokens": 0,
		"tokens_per_minute": 0,
		"requests_per_minute": 0,
		"kv_blocks": 0,
		"priority": 0,
		"principal_requests_per_minute": 0,
		"principal_tokens_per_minute": 0,
		"concurrent_requests": 0,
		"max_choices": 0,
		"fail_open": false,
		"max_schema_bytes": 0,
		"max_schema_depth": 0,
	},
}

decision := _allowed if count(_deny_reasons) == 0

decision := _denied if count(_deny_reasons) > 0

_deny_reasons := (authz.deny | limits.deny) | authn.deny

_allowed := {
	"allow": true,
	"reasons": sort((((cache.notes | batching.notes) | (logging.notes | limits.notes)) | (prompt.notes | responses.notes))),
	"cache": {"scope": cache.scope, "namespace": cache.namespace, "segments": sort([s | some s in cache.segments])},
	"batching": {
		"isolation": batching.isolation,
		"deterministic": batching.deterministic,
		"speculative": batching.speculative,
	},
	"logging": {
		"content": logging.content,
		"redact": logging.redact,
		"retention_days": logging.retention_days,
		"metrics_name": logging.metrics_name,
	},
	"prompt": {"special_tokens": prompt.special_tokens},
	"responses": {"store": responses.store, "retention_days": responses.retention_days},
	"authentication": _authentication,
	# The tenant's budgets in one rule, and the request's max_tokens (policies/limits).
	"limits": object.union(limits.budgets, {"max_tokens": limits.max_tokens}),
}

_denied := {
	"allow": false,
	"reasons": sort(_deny_reasons),
	"cache": {"scope": "none", "namespace": "", "segments": []},
	"batching": {"isolation": "exclusive", "deterministic": false, "speculative": false},
	"logging": {
		"content": "none", "redact": sort(logging.base_redact), "retention_days": 30,
		"metrics_name": logging.metrics_name, # one label per tenant, allowed or denied
	},
	"prompt": {"special_tokens": false},
	"responses": {"store": false, "retention_days": 30},
	"authentication": _authentication,
	"limits": {
		"max_tokens": 0,
		"max_context_tokens": 0,
		"tokens_per_minute": 0,
		"requests_per_minute": 0,
		"kv_blocks": 0,
		"priority": 0,
		"principal_requests_per_minute": 0,
		"principal_tokens_per_minute": 0,
		"concurrent_requests": 0,
		"max_choices": 0,
		"fail_open": false,
		"max_schema_bytes": 0,
		"max_schema_depth": 0,
	},
}

# What the gateway needs to answer a token that lacks what the request needs (policies/authn):
# in allowed and denied decisions alike, so a deny for a missing context can become a challenge.
_authentication := {
	"contexts": authn.contexts,
	"missing": authn.missing,
	"max_age_s": authn.max_age_s,
	"revoked": authn.revoked,
	"challenge": authn.challenge,
}
