package tenantgate.limits_test

import data.tenantgate.limits

_tenants := {"t1": {"limits": {
	"max_tokens": 1024,
	"max_context_tokens": 8192,
	"tokens_per_minute": 100000,
	"requests_per_minute": 600,
	"kv_blocks": 2048,
	"priority": 1,
}}}

_limits(request) := result if {
	result := {
		"max_tokens": limits.max_tokens,
		"max_context_tokens": limits.max_context_tokens,
		"tokens_per_minute": limits.tokens_per_minute,
		"requests_per_minute": limits.requests_per_minute,
		"kv_blocks": limits.kv_blocks,
		"priority": limits.priority,
		"notes": limits.notes,
	} with input as {"principal": {"tenant_id": "t1"}, "request": request}
		with data.tenants as _tenants
}

_deny(request) := reasons if {
	reasons := limits.deny with input as {"principal": {"tenant_id": "t1"}, "request": request}
		with data.tenants as _tenants
}

test_allow_requested_max_tokens_under_limit if {
	l := _limits({"prompt_tokens": 100, "max_tokens": 256})
	l.max_tokens == 256
	l.notes == set()
	_deny({"prompt_tokens": 100, "max_tokens": 256}) == set()
}

test_allow_tenant_budgets_copied_from_data if {
	l := _limits({"prompt_tokens": 100, "max_tokens": 256})
	l.max_context_tokens == 8192
	l.tokens_per_minute == 100000
	l.requests_per_minute == 600
	l.kv_blocks == 2048
	l.priority == 1
}

test_allow_max_tokens_clamped_to_limit if {
	l := _limits({"prompt_tokens": 100, "max_tokens": 4096})
	l.max_tokens == 1024
	l.notes == {"max_tokens clamped to the tenant's limit"}
}

# The window is the gateway's to apply (gateway/pipeline/admission.py, effective_max_tokens): the
# decision is the same for every prompt length, so one cached decision serves them all.
test_allow_the_prompts_length_changes_nothing if {
	every prompt_tokens in [0, 100, 8000, 8192, 20000, -1, 2.5, "long"] {
		_limits({"prompt_tokens": prompt_tokens, "max_tokens": 1000}) == _limits({"max_tokens": 1000})
		_deny({"prompt_tokens": prompt_tokens, "max_tokens": 1000}) == set()
	}
}

test_allow_absent_max_tokens_takes_the_limit if {
	l := _limits({"prompt_tokens": 10})
	l.max_tokens == 1024
	l.notes == set()
}

test_deny_non_positive_max_tokens if {
	every bad in [0, -5, 1.5, "many", true] {
		_deny({"prompt_tokens": 10, "max_tokens": bad}) == {"max_tokens must be a positive integer"}
	}
}

test_allow_principal_limits_default_to_the_tenants if {
	l := limits with input as {"principal": {"tenant_id": "t1"}, "request": {"prompt_tokens": 10}}
		with data.tenants as {"t1": {"limits": {
			"max_tokens": 10, "max_context_tokens": 100, "tokens_per_minute": 1000,
			"requests_per_minute": 60, "kv_blocks": 8, "priority": 0,
		}}}
	l.principal_requests_per_minute == 60
	l.principal_tokens_per_minute == 1000
	l.concurrent_requests == 64
	l.max_choices == 4
	l.fail_open == false
	l.max_schema_bytes == 16384
	l.max_schema_depth == 16
}

test_allow_tenant_sets_principal_limits_and_fail_open if {
	l := limits with input as {"principal": {"tenant_id": "t1"}, "request": {"prompt_tokens": 10}}
		with data.tenants as {"t1": {"limits": {
			"max_tokens": 10, "max_context_tokens": 100, "tokens_per_minute": 1000,
			"requests_per_minute": 60, "kv_blocks": 8, "priority": 0,
			"principal_requests_per_minute": 6, "principal_tokens_per_minute": 100,
			"concurrent_requests": 2, "fail_open": true, "max_choices": 1,
			"max_schema_bytes": 512, "max_schema_depth": 3,
		}}}
	l.principal_requests_per_minute == 6
	l.principal_tokens_per_minute == 100
	l.concurrent_requests == 2
	l.max_choices == 1
	l.fail_open == true
	l.max_schema_bytes == 512
	l.max_schema_depth == 3
}

test_allow_embeddings_generate_nothing if {
	l := _limits({"route": "embeddings", "prompt_tokens": 100})
	l.max_tokens == 1024 # the tenant's limit, as an allowed decision needs one; the gateway ignores it
	l.notes == set()
}

test_allow_embeddings_inputs_beyond_the_context_window if {
	# Each input is cut at the encoder's length; their sum is a budget matter, not a window's.
	_deny({"route": "embeddings", "prompt_tokens": 20000}) == set()
	_limits({"route": "embeddings", "prompt_tokens": 20000}).max_tokens == 1024
}
