"""The JSON walkers keep no Python frames per level: a value nested 100,000 deep (far past the
recursion limit) is measured and searched like a flat one."""

from __future__ import annotations

from gateway.json_values import json_depth, json_strings


def deep_list(levels: int) -> list:
    value: list = ["leaf"]
    for _ in range(levels - 1):
        value = [value]
    return value


def test_depth_counts_objects_and_arrays() -> None:
    assert json_depth("text") == 0
    assert json_depth({}) == 1
    assert json_depth({"a": [1, {"b": []}]}) == 4
    assert json_depth(deep_list(100_000)) == 100_000


def test_strings_include_keys_at_any_depth() -> None:
    assert sorted(json_strings({"k": ["v", {"inner": 3}]})) == ["inner", "k", "v"]
    assert list(json_strings(deep_list(100_000))) == ["leaf"]
