"""What a typing.Protocol declares, to check that every implementation has it."""

from __future__ import annotations


def protocol_members(protocol: type) -> set[str]:
    """The attributes and methods `protocol` declares (typing.get_protocol_members from Python 3.13)."""
    return set(vars(protocol).get("__annotations__", {})) | {
        name for name, value in vars(protocol).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))}
