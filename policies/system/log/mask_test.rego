package system.log_test

import data.system.log

test_deny_message_contents_in_decision_logs if {
	every path in ["/input/request/messages", "/input/request/prompt", "/input/request/input", "/input/response"] {
		path in log.mask with input as {"input": {}}
	}
}

test_deny_bearer_token_in_decision_logs if {
	masks := log.mask with input as {"input": {"request": {"headers": {"authorization": "Bearer eyJ0"}}}}
	{"op": "upsert", "path": "/input/request/headers/authorization", "value": "[redacted]"} in masks
}

test_allow_inputs_without_headers_unchanged_apart_from_erasures if {
	masks := log.mask with input as {"input": {"principal": {"tenant_id": "t1"}}}
	every mask in masks {
		is_string(mask)
	}
}
