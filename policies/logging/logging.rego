# METADATA
# title: Logging
# description: |
#   What of a request may reach a log. Content is "none" unless the tenant opts
#   into "redacted"; restricted data is never logged. The redact list holds JSON
#   pointers the gateway removes before anything is written; in "redacted" mode
#   the content that remains then passes the secret and PII detectors.
package tenantgate.logging

_tenant := data.tenants[input.principal.tenant_id]

# METADATA
# description: Pointers removed from every record, whatever the tenant says.
always_redact := {"/request/headers/authorization"}

# METADATA
# description: Where prompts and completions live; removed unless content is "redacted".
content_pointers := {
	"/request/input",
	"/request/messages",
	"/request/prompt",
	"/response/choices",
}

# METADATA
# description: What a record without content keeps out (denied requests use it too).
base_redact := always_redact | content_pointers

default content := "none"

content := "none" if {
	input.request.data_classification == "restricted"
} else := _tenant.logging.content

_tenant_redact := {pointer | some pointer in _tenant.logging.redact}

redact := sort(always_redact | _tenant_redact) if content == "redacted"

redact := sort(base_redact | _tenant_redact) if content != "redacted"

default retention_days := 30

retention_days := _tenant.logging.retention_days

notes contains "restricted data: content logging off" if {
	input.request.data_classification == "restricted"
	_tenant.logging.content != "none"
}
