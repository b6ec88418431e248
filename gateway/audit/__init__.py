"""One audit record per request: digests and numbers, never content."""

from gateway.audit.log import AuditLog

__all__ = ["AuditLog"]
