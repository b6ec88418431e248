"""The read-only operator console (/console on the operator listener): tenants and their
decisions, quota headroom, KV by tenant, prefix hits, the regime timeline, the audit chain's
status and the live policy revision, as digests and numbers."""

from gateway.console.router import install_console
from gateway.console.views import SERIES, VIEWS, console_views

__all__ = ["SERIES", "VIEWS", "console_views", "install_console"]
