# METADATA
# title: Batch isolation
# description: |
#   Which sequences a request may share a decode step with, and whether it runs
#   in the deterministic (batch-invariant) lane.
package tenantgate.batching

_tenant := data.tenants[input.principal.tenant_id]

default isolation := "exclusive"

# Restricted data runs alone, whatever the tenant's default.
isolation := "exclusive" if {
	input.request.data_classification == "restricted"
} else := _tenant.isolation

default deterministic := false

# Tenants that must reproduce outputs (audits, regulated workloads) get the deterministic lane.
deterministic if _tenant.deterministic == true

notes contains "restricted data: exclusive batch isolation" if {
	input.request.data_classification == "restricted"
	_tenant.isolation != "exclusive"
}
