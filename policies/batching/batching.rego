# METADATA
# title: Batch isolation
# description: |
#   Which sequences a request may share a decode step with, whether it runs
#   in the deterministic (batch-invariant) lane, and whether the engine may
#   speculate on it (draft tokens from its own context, verified in one step).
package tenantgate.batching

# The caller's tenant record, shared by the decision's packages (policies/tenant).
import data.tenantgate.tenant.record as _tenant

default isolation := "exclusive"

# Restricted data runs alone, whatever the tenant's default.
isolation := "exclusive" if {
	input.request.data_classification == "restricted"
} else := _tenant.isolation

default deterministic := false

# Tenants that must reproduce outputs (audits, regulated workloads) get the deterministic lane.
deterministic if _tenant.deterministic == true

default speculative := false

# Speculation drafts only from the request's own tokens and keeps its output distribution, so
# it is on unless the tenant turns it off; never in the deterministic lane, whose proof of batch
# invariance covers one-token decode steps.
speculative if {
	not deterministic
	_tenant.isolation # a known tenant
	not _tenant.speculative == false
}

notes contains "restricted data: exclusive batch isolation" if {
	input.request.data_classification == "restricted"
	_tenant.isolation != "exclusive"
}
