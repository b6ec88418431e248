# METADATA
# title: Logging
# description: |
#   What of a request may reach a log. Content is "none" unless the tenant opts
#   into "redacted"; restricted data is never logged. The redact list holds JSON
#   pointers the gateway removes before anything is written.
package tenantgate.logging

_tenant := data.tenants[input.principal.tenant_id]

# METADATA
# description: Pointers removed from every record, whatever the tenant says.
base_redact := {
	"/request/headers/authorization",
	"/request/messages",
	"/request/prompt",
	"/response/choices",
}

default content := "none"

content := "none" if {
	input.request.data_classification == "restricted"
} else := _tenant.logging.content

redact := sort(base_redact | {pointer | some pointer in _tenant.logging.redact})

default retention_days := 30

retention_days := _tenant.logging.retention_days

notes contains "restricted data: content logging off" if {
	input.request.data_classification == "restricted"
	_tenant.logging.content != "none"
}
