# METADATA
# title: The caller's tenant
# description: |
#   The caller's tenant record from data.tenants (undefined for a tenant that is not
#   registered), looked up once per evaluation for every package of the decision.
#   Each package imports it as `_tenant` rather than keeping a rule of its own: regorus
#   evaluates each copy of a rule apart, so one shared rule measures cheaper than eight
#   (docs/policy-reference.md, "Evaluation cost").
package tenantgate.tenant

# METADATA
# description: The caller's tenant record, as data.tenants holds it.
record := data.tenants[input.principal.tenant_id]
