"""Request and token budgets from the decision's limits: in-process, or in Redis across replicas."""

from gateway.limits.base import Admission, Limiter, QuotaStoreUnavailable, Ticket
from gateway.limits.headroom import Headroom, QuotaHeadroom
from gateway.limits.memory import InProcessLimiter

__all__ = ["Admission", "Headroom", "InProcessLimiter", "Limiter", "QuotaHeadroom", "QuotaStoreUnavailable", "Ticket"]
