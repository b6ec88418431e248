# METADATA
# title: Prompt parsing
# description: |
#   Whether a text-completion prompt may spell the model's special tokens (such as
#   <|im_start|>) and have them read as those tokens. Off unless the tenant's data turns
#   it on: a caller who may write control tokens can forge any role, which suits a tenant
#   that renders its own templates and no tenant that passes end-user text through.
#   Chat messages are always plain text; only the chat template writes control tokens.
package tenantgate.prompt

# The caller's tenant record, shared by the decision's packages (policies/tenant).
import data.tenantgate.tenant.record as _tenant

default special_tokens := false

special_tokens if {
	input.request.route == "completions"
	_tenant.prompt.special_tokens == true
}

notes contains "completion prompt: special-token strings are read as special tokens" if special_tokens
