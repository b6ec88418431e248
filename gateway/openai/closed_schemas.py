"""JSON schemas closed where they leave extra keys unsaid, as xgrammar's strict mode closes them.

JSON Schema lets an object carry keys its `properties` do not name unless `additionalProperties`
says otherwise, and a tuple (`prefixItems`) carry more items unless `items` does. A grammar that
follows that lets a small model ramble: with tool parameters {"properties": {"city": ...}} SmolLM2
writes {"city": "Paris", "weather": {...  until its length runs out. So an object schema that names
its properties and says nothing of more gets `additionalProperties: false`, and a tuple that says
nothing of more items gets `items: false`. A schema that says more are allowed keeps them.

Under `strict: true` a schema that allows more keys is refused, as OpenAI refuses it.
"""

from __future__ import annotations

import copy

# Keywords whose value is one schema, a list of schemas, or a map of names to schemas.
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _subschemas(node: dict):
    for key in _ONE:
        value = node.get(key)
        if isinstance(value, dict):
            yield value
        elif key == "items" and isinstance(value, list):  # draft 4-7 tuples
            yield from (v for v in value if isinstance(v, dict))
    for key in _LIST:
        value = node.get(key)
        if isinstance(value, list):
            yield from (v for v in value if isinstance(v, dict))
    for key in _MAP:
        value = node.get(key)
        if isinstance(value, dict):
            yield from (v for v in value.values() if isinstance(v, dict))


def _schemas(schema: dict):
    """Every schema in `schema`, itself included (iteratively: depth was bounded before)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(_subschemas(node))


# What an object schema may say of keys its properties do not name, and a tuple of more items.
_MORE_KEYS = {"additionalProperties", "unevaluatedProperties", "patternProperties"}


def closed(schema: dict) -> dict:
    """A copy of `schema` with every object that names its properties, and every tuple, closed
    where it says nothing of more."""
    schema = copy.deepcopy(schema)
    for node in _schemas(schema):
        if "properties" in node and not _MORE_KEYS & node.keys():
            node["additionalProperties"] = False
        if isinstance(node.get("prefixItems"), list) and not {"items", "unevaluatedItems"} & node.keys():
            node["items"] = False
    return schema


def allows_more_keys(schema: dict) -> bool:
    """Whether some object in `schema` explicitly allows keys its properties do not name (what
    strict mode refuses)."""
    return any(node.get("additionalProperties", False) is not False for node in _schemas(schema))


def check_strict(schema: dict | None, strict: bool | None, what: str) -> None:
    """Under strict, a schema that allows more keys anywhere is refused (ValueError: a 400 naming
    the field), as OpenAI refuses it; `what` names it in the message ("function 'weather'")."""
    if strict and schema is not None and allows_more_keys(schema):
        raise ValueError(f"Invalid schema for {what}: under strict, 'additionalProperties' must be false "
                         "wherever it is supplied")
