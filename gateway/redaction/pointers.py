"""Structural redaction: remove the parts of a document that a decision names.

A decision lists RFC 6901 JSON pointers ("/request/messages/0/content"). Each is
resolved against the original document, so removing "/a/0" and "/a/1" removes the
first two items rather than the first and the third. A "*" segment matches every item of
an array or every member of an object ("/request/messages/*/name"); a literal "*"
member is therefore reachable only through the wildcard. A pointer to a path the
document lacks removes nothing. The empty pointer "" names the whole document, which
leaves an empty one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from gateway.redaction.exceptions import InvalidPointerError

WILDCARD = "*"
_REMOVE = object()  # marks a node of the removal tree whose value goes entirely


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """The unescaped reference tokens of one pointer ("/a~1b/~0c" -> ("a/b", "~c"))."""
    if not isinstance(pointer, str):
        raise InvalidPointerError("a JSON pointer must be a string")
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise InvalidPointerError("a JSON pointer must be empty or start with '/'")
    tokens = pointer[1:].split("/")
    for token in tokens:
        # "~" may only start "~0" or "~1" (RFC 6901 section 3)
        if "~" in token.replace("~0", "").replace("~1", ""):
            raise InvalidPointerError("a JSON pointer may only escape '~0' and '~1'")
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in tokens)


def remove_pointers(document: Any, pointers: Sequence[str]) -> Any:
    """A copy of `document` without the values the pointers name; the input is untouched.

    Objects and arrays are copied; strings, numbers and the like are immutable and shared.
    """
    tree = removal_tree(document, pointers)
    if tree is None:
        return type(document)() if isinstance(document, (dict, list)) else None
    return copy_without(document, tree)


def removal_tree(document: Any, pointers: Sequence[str]) -> dict | None:
    """The paths to remove as a tree of keys and indices; None when "" removes everything.

    Every pointer is resolved against the original document before anything is removed.
    """
    if isinstance(pointers, str):
        raise InvalidPointerError("pointers must be a sequence of JSON pointers, not one string")
    tree: dict = {}
    for pointer in pointers:
        tokens = parse_pointer(pointer)
        if not tokens:
            return None
        for path in _resolve(document, tokens):
            _mark(tree, path)
    return tree


def copy_without(value: Any, tree: dict | None, leaf=None) -> Any:
    """Copy `value`, leaving out what the removal tree marks; `leaf` maps every other scalar."""
    if isinstance(value, dict):
        copied = {}
        for key, item in value.items():
            branch = tree.get(key) if tree else None
            if branch is _REMOVE:
                continue
            copied_key = leaf(key) if leaf is not None and isinstance(key, str) else key
            copied[copied_key] = copy_without(item, branch, leaf)
        return copied
    if isinstance(value, (list, tuple)):
        copied_items = []
        for index, item in enumerate(value):
            branch = tree.get(index) if tree else None
            if branch is _REMOVE:
                continue
            copied_items.append(copy_without(item, branch, leaf))
        return copied_items
    return leaf(value) if leaf is not None else value


def _resolve(value: Any, tokens: tuple[str, ...]) -> Iterator[tuple]:
    """Every concrete path (keys and indices) in `value` that `tokens` matches."""
    if not tokens:
        yield ()
        return
    head, rest = tokens[0], tokens[1:]
    for step, child in _children(value, head):
        for path in _resolve(child, rest):
            yield (step, *path)


def _children(value: Any, token: str) -> Iterator[tuple[Any, Any]]:
    if isinstance(value, dict):
        if token == WILDCARD:
            yield from value.items()
        elif token in value:
            yield token, value[token]
    elif isinstance(value, (list, tuple)):
        if token == WILDCARD:
            yield from enumerate(value)
        elif _is_array_index(token) and int(token) < len(value):
            yield int(token), value[int(token)]


def _is_array_index(token: str) -> bool:
    # RFC 6901: "0" or digits without a leading zero; "-" names no existing item
    return token.isascii() and token.isdigit() and (token == "0" or not token.startswith("0"))


def _mark(tree: dict, path: tuple) -> None:
    node = tree
    for step in path[:-1]:
        child = node.get(step)
        if child is _REMOVE:
            return  # an ancestor already goes
        if child is None:
            child = node[step] = {}
        node = child
    node[path[-1]] = _REMOVE
