"""Redaction errors. None carries document content: messages are fixed strings."""


class RedactionError(Exception):
    """Base class: a document could not be redacted, so nothing of it may be written."""


class InvalidPointerError(RedactionError, ValueError):
    """A JSON pointer from the decision is malformed (RFC 6901)."""
