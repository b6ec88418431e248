# METADATA
# title: Authorization
# description: |
#   Who may call which model from which deployment. Every entry in deny is a
#   message safe to show the caller: it names the rule, never a secret or
#   another tenant.
package tenantgate.authz

# The caller's tenant record, shared by the decision's packages (policies/tenant).
import data.tenantgate.tenant.record as _tenant

# METADATA
# description: The delegated permission a user (delegated) token must carry.
required_scope := "Inference.Invoke"

# METADATA
# description: The application role an app-only token must carry.
required_app_role := "Inference.Invoke.All"

# METADATA
# description: Data classifications the gateway understands; anything else is denied.
classifications := {"public", "internal", "confidential", "restricted"}

deny contains "the caller's tenant is not registered with this gateway" if not _tenant

deny contains "the caller's tenant is suspended" if _tenant.enabled == false

deny contains "the token carries no object id" if not _has_object_id

deny contains "the requested model is not available to this tenant" if {
	_tenant
	not _model_allowed
}

deny contains "this deployment's region is not allowed for the tenant" if {
	_tenant
	not _region_allowed
}

deny contains "the app-only token lacks the Inference.Invoke.All app role" if {
	input.principal.idtyp == "app"
	not _has_app_role
}

deny contains "the delegated token lacks the Inference.Invoke scope" if {
	input.principal.idtyp == "user"
	not _has_scope
}

deny contains "the token type is not recognised" if not _token_type_known

deny contains "the request's data classification is missing or unknown" if not _classification_known

_has_object_id if {
	is_string(input.principal.object_id)
	input.principal.object_id != ""
}

# Membership is tested in positive helpers: `not x in xs` with an undefined x differs
# between engines, `not _helper` does not.
_model_allowed if input.request.model in _tenant.models

_region_allowed if input.deployment.region in _tenant.regions

_has_app_role if required_app_role in input.principal.roles

_has_scope if required_scope in input.principal.scopes

_token_type_known if input.principal.idtyp in {"user", "app"}

_classification_known if input.request.data_classification in classifications
