"""Twenty JSON schemas of every kind structured outputs must honour (objects, arrays, enums,
nesting, numbers, booleans, required fields), each with a short minimal answer, so a small
max_tokens finishes them: every integer and number is bounded, every free string has a
maxLength (a greedy small model otherwise writes digits until max_tokens). The proof test and
bench/constrained.py both use them."""

from __future__ import annotations

SCHEMAS: dict[str, dict] = {
    "person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"], "additionalProperties": False},
    "flag": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
             "additionalProperties": False},
    "color": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
              "required": ["color"], "additionalProperties": False},
    "bounded_number": {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
                       "required": ["score"], "additionalProperties": False},
    "int_range": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
                  "required": ["n"], "additionalProperties": False},
    "tags": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                                       "minItems": 1, "maxItems": 3}},
             "required": ["tags"], "additionalProperties": False},
    "int_array": {"type": "array", "items": {"type": "integer", "minimum": -99, "maximum": 99},
                  "minItems": 2, "maxItems": 4},
    "nested": {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999}, "admin": {"type": "boolean"}},
        "required": ["id", "admin"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "point": {"type": "object", "properties": {"x": {"type": "number", "minimum": -10, "maximum": 10},
                                               "y": {"type": "number", "minimum": -10, "maximum": 10}},
              "required": ["x", "y"], "additionalProperties": False},
    "const_version": {"type": "object", "properties": {"version": {"const": 2}, "name": {"type": "string",
                                                                                           "maxLength": 10}},
                      "required": ["version", "name"], "additionalProperties": False},
    "nullable": {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 10}},
                 "required": ["note"], "additionalProperties": False},
    "enum_array": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
    "any_of": {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99},
                                                                    {"type": "boolean"}]}},
               "required": ["value"], "additionalProperties": False},
    "optional_fields": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                                         "label": {"type": "string", "maxLength": 12}},
                        "required": ["id"], "additionalProperties": False},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"}},
                "required": ["code"], "additionalProperties": False},
    "array_of_objects": {"type": "array",
                         "items": {"type": "object",
                                   "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 9}},
                                   "required": ["k"], "additionalProperties": False},
                         "minItems": 1, "maxItems": 2},
    "deep": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object",
             "properties": {"c": {"type": "boolean"}}, "required": ["c"], "additionalProperties": False}},
             "required": ["b"], "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    "refs": {"$defs": {"money": {"type": "object",
                                 "properties": {"cents": {"type": "integer", "minimum": 0, "maximum": 9999}},
                                 "required": ["cents"], "additionalProperties": False}},
             "type": "object", "properties": {"price": {"$ref": "#/$defs/money"}}, "required": ["price"],
             "additionalProperties": False},
    "mixed": {"type": "object", "properties": {"title": {"type": "string", "maxLength": 10},
                                               "done": {"type": "boolean"}, "priority": {"enum": [1, 2, 3]}},
              "required": ["title", "done", "priority"], "additionalProperties": False},
    "string_enum_or_number": {"type": "object",
                              "properties": {"unit": {"enum": ["kg", "lb"]},
                                             "amount": {"type": "number", "minimum": 0, "maximum": 100}},
                              "required": ["unit", "amount"], "additionalProperties": False},
}


def pattern_properties_schema(count: int) -> dict:
    """An object schema with `count` patternProperties, each a short anchored literal (^0$, ^1$, … in hex)."""
    return {"type": "object", "patternProperties": {f"^{i:x}$": {} for i in range(count)}}


def expensive_schema(max_bytes: int = 16384) -> dict:
    """The costliest schema to compile that we found within a byte bound (the policy's default
    max_schema_bytes: 16384): as many patternProperties as fit. llguidance proves each pair of
    them disjoint by intersecting their regexes, with no limit on the whole, so the cost grows
    with the square of their number (and faster: its regex builder grows as it goes). Measured
    standalone on the 2-core VM: 200 patterns (2 KB) 0.4 s, 400 (4 KB) 5-20 s, 450 longer ones
    (17 KB) 34-46 s. anyOf/oneOf nests, 1,700-value enums, counted repetition and numeric ranges
    of the same size all compiled in under 0.1 s (the regex and lexer work is under llguidance's fuel)."""
    count = 0
    size = len('{"type":"object","patternProperties":{}}')
    while size + len(f'"^{count:x}$":{{}}') + (count > 0) <= max_bytes:
        size += len(f'"^{count:x}$":{{}}') + (count > 0)
        count += 1
    return pattern_properties_schema(count)
