package tenantgate.prompt_test

import data.tenantgate.prompt

_tenants := {
	"t1": {"prompt": {"special_tokens": true}},
	"t2": {"prompt": {"special_tokens": false}},
	"t3": {},
	"t4": {"prompt": {"special_tokens": "yes"}},
}

_special(tenant, route) := value if {
	value := prompt.special_tokens with input as {"principal": {"tenant_id": tenant}, "request": {"route": route}}
		with data.tenants as _tenants
}

test_allow_special_tokens_when_the_tenant_turns_them_on_for_completions if {
	_special("t1", "completions") == true
	"completion prompt: special-token strings are read as special tokens" in prompt.notes with input as {
		"principal": {"tenant_id": "t1"},
		"request": {"route": "completions"},
	}
		with data.tenants as _tenants
}

test_deny_special_tokens_in_chat_even_when_turned_on if {
	_special("t1", "chat.completions") == false
}

test_deny_special_tokens_by_default if {
	_special("t2", "completions") == false
	_special("t3", "completions") == false
	_special("unknown", "completions") == false
}

test_deny_special_tokens_unless_exactly_true if {
	_special("t4", "completions") == false
}
