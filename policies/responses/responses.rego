# METADATA
# title: Stored responses
# description: |
#   Whether /v1/responses may store a response (store: true) and continue one
#   (previous_response_id), and for how long it is kept. Off unless the tenant's data
#   turns it on; restricted data is never stored. Only the responses route stores.
package tenantgate.responses

# The caller's tenant record, shared by the decision's packages (policies/tenant).
import data.tenantgate.tenant.record as _tenant

default store := false

store if {
	input.request.route == "responses"
	input.request.data_classification != "restricted"
	_tenant.responses.store == true
}

default retention_days := 30

retention_days := _tenant.responses.retention_days if {
	is_number(_tenant.responses.retention_days)
	_tenant.responses.retention_days >= 1
	_tenant.responses.retention_days <= 365
}

notes contains sprintf("responses: stored, encrypted, for %d days", [retention_days]) if store

notes contains "restricted data: responses are not stored" if {
	input.request.route == "responses"
	input.request.data_classification == "restricted"
	_tenant.responses.store == true
}
