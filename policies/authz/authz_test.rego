package tenantgate.authz_test

import data.tenantgate.authz

_tenants := {"t1": {
	"enabled": true,
	"models": ["m1"],
	"regions": ["westeurope"],
}}

_user := {"tenant_id": "t1", "object_id": "o1", "idtyp": "user", "scopes": ["Inference.Invoke"], "roles": []}

_app := {"tenant_id": "t1", "object_id": "o2", "idtyp": "app", "scopes": [], "roles": ["Inference.Invoke.All"]}

_request := {"model": "m1", "data_classification": "internal"}

_input(principal, request, region) := {
	"principal": principal,
	"request": request,
	"deployment": {"region": region},
}

_deny(principal, request, region) := reasons if {
	reasons := authz.deny with input as _input(principal, request, region)
		with data.tenants as _tenants
}

test_allow_delegated_token_with_scope if {
	count(_deny(_user, _request, "westeurope")) == 0
}

test_allow_app_token_with_role if {
	count(_deny(_app, _request, "westeurope")) == 0
}

test_deny_unknown_tenant if {
	_deny(object.union(_user, {"tenant_id": "nobody"}), _request, "westeurope") == {
		"the caller's tenant is not registered with this gateway",
	}
}

test_deny_missing_principal if {
	reasons := authz.deny with input as {"request": _request, "deployment": {"region": "westeurope"}}
		with data.tenants as _tenants
	"the caller's tenant is not registered with this gateway" in reasons
	"the token type is not recognised" in reasons
	"the token carries no object id" in reasons
}

test_deny_suspended_tenant if {
	reasons := authz.deny with input as _input(_user, _request, "westeurope")
		with data.tenants as {"t1": object.union(_tenants.t1, {"enabled": false})}
	reasons == {"the caller's tenant is suspended"}
}

test_deny_empty_object_id if {
	_deny(object.union(_user, {"object_id": ""}), _request, "westeurope") == {"the token carries no object id"}
}

test_deny_model_not_allowed if {
	_deny(_user, object.union(_request, {"model": "m2"}), "westeurope") == {
		"the requested model is not available to this tenant",
	}
}

test_deny_missing_model if {
	_deny(_user, {"data_classification": "internal"}, "westeurope") == {
		"the requested model is not available to this tenant",
	}
}

test_deny_region_not_allowed if {
	_deny(_user, _request, "eastus") == {"this deployment's region is not allowed for the tenant"}
}

test_deny_app_token_without_role if {
	_deny(object.union(_app, {"roles": ["Other.Role"], "scopes": ["Inference.Invoke"]}), _request, "westeurope") == {
		"the app-only token lacks the Inference.Invoke.All app role",
	}
}

test_deny_user_token_without_scope if {
	_deny(object.union(_user, {"scopes": [], "roles": ["Inference.Invoke.All"]}), _request, "westeurope") == {
		"the delegated token lacks the Inference.Invoke scope",
	}
}

test_deny_unknown_token_type if {
	_deny(object.union(_user, {"idtyp": "device"}), _request, "westeurope") == {"the token type is not recognised"}
}

test_deny_unknown_classification if {
	_deny(_user, object.union(_request, {"data_classification": "secret"}), "westeurope") == {
		"the request's data classification is missing or unknown",
	}
}

test_allow_every_known_classification if {
	every classification in authz.classifications {
		count(_deny(_user, object.union(_request, {"data_classification": classification}), "westeurope")) == 0
	}
}
