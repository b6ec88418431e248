# METADATA
# title: Decision-log masking
# description: |
#   OPA's decision-log mask (system.log.mask): the same fields the gateway never
#   logs are erased from every decision-log event before it leaves OPA, and a
#   bearer token that slipped into the input is replaced, never kept.
package system.log

# METADATA
# description: Input fields erased from decision logs (message contents, prompts).
erased_paths := {
	"/input/request/messages",
	"/input/request/prompt",
	"/input/request/input",
	"/input/response",
}

mask contains path if some path in erased_paths

mask contains {"op": "upsert", "path": "/input/request/headers/authorization", "value": "[redacted]"} if {
	input.input.request.headers.authorization
}
