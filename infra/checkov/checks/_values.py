"""Reading resource configurations the way checkov hands them over.

Terraform configurations wrap every attribute and block in a list (`{"mode": ["Prevention"]}`);
ARM and Bicep configurations are plain JSON-like dicts. `first` unwraps one level of the former;
`dig` walks a path through either. A value checkov could not resolve stays an expression string
(`"var.x"`, `"${...}"`), which never equals the literal a check wants, so unresolved means failed.
"""

from __future__ import annotations

from typing import Any


def first(value: Any) -> Any:
    """The single value of a Terraform attribute or block ([x] -> x); anything else unchanged."""
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


def dig(conf: Any, *path: str) -> Any:
    """conf[path[0]][path[1]]..., unwrapping Terraform's one-element lists; None when absent."""
    node = first(conf)
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = first(node[key])
    return node


def is_true(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def is_false(value: Any) -> bool:
    return value is False or (isinstance(value, str) and value.lower() == "false")


def blocks(conf: Any, name: str) -> list[dict]:
    """The repeated blocks `name` of a Terraform resource (each a dict)."""
    value = conf.get(name) if isinstance(conf, dict) else None
    if not isinstance(value, list):
        return []
    return [block for block in value if isinstance(block, dict)]
