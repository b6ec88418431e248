# METADATA
# title: Logging
# description: |
#   What of a request may reach a log. Content is "none" unless the tenant opts
#   into "redacted"; restricted data is never logged. The redact list holds JSON
#   pointers the gateway removes before anything is written; in "redacted" mode
#   the content that remains then passes the secret and PII detectors. Metrics
#   label a tenant by its keyed digest unless its data allows its name.
package tenantgate.logging

# The caller's tenant record, shared by the decision's packages (policies/tenant).
import data.tenantgate.tenant.record as _tenant

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

# The tenant's own pointers, none when its data names none (or there is no such tenant). A value
# that is not a list leaves them (and so the decision) undefined, which denies: OPA iterates a number
# or a string as nothing where regorus refuses to, and neither may serve a tenant with fewer
# redactions than it asked for.
_tenant_redact := set() if {
	not _tenant
} else := {pointer | some pointer in pointers} if {
	pointers := object.get(_tenant, ["logging", "redact"], [])
	is_array(pointers)
}

redact := sort(always_redact | _tenant_redact) if content == "redacted"

redact := sort(base_redact | _tenant_redact) if content != "redacted"

default retention_days := 30

retention_days := _tenant.logging.retention_days

notes contains "restricted data: content logging off" if {
	input.request.data_classification == "restricted"
	_tenant.logging.content != "none"
}

# METADATA
# description: |
#   The tenant's name, for metric labels in place of its keyed digest, when its data says
#   name_in_metrics and the name can be a label (ASCII letters, digits, space, ".", "-", "_";
#   at most 64); "" otherwise (the digest).
default metrics_name := ""

metrics_name := _tenant.name if {
	_tenant.logging.name_in_metrics == true
	is_string(_tenant.name)
	regex.match(`^[A-Za-z0-9_][A-Za-z0-9_ .-]{0,63}$`, _tenant.name)
}
