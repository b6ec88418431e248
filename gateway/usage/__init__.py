"""Usage and chargeback: the audit trail, verified as it is read, summed per tenant,
principal, model and deployment, optionally priced (`tenantgate usage report`, /admin/usage)."""

from gateway.usage.report import (
           ModelPrice,
           Prices,
           TrailRejected,
           Usage,
           UsageError,
           load_names,
           load_prices,
           parse_time,
           read_usage,
           to_csv,
)

__all__ = ["ModelPrice", "Prices", "TrailRejected", "Usage", "UsageError", "load_names", "load_prices", "parse_time",
           "read_usage", "to_csv"]
