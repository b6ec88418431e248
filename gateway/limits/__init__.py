"""Request and token budgets from the decision's limits."""

from gateway.limits.memory import InProcessLimiter, Reservation

__all__ = ["InProcessLimiter", "Reservation"]
