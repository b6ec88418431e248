"""Walks over decoded JSON values (dicts, lists, scalars) with a stack, never recursion: a caller
controls how deeply a request nests, and Python's recursion limit must not be what bounds it."""

from __future__ import annotations

from collections.abc import Iterator


def json_depth(value: object) -> int:
    """How deeply objects and arrays nest in a JSON value (a scalar is 0, {} or [] is 1)."""
    depth, level = 0, [(value, 1)]
    while level:
        value, d = level.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is not None:
            depth = max(depth, d)
            level.extend((child, d + 1) for child in children)
    return depth


def json_strings(value: object) -> Iterator[str]:
    """Every string in a JSON value, object keys included."""
    stack = [value]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
