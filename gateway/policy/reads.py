"""What a policy reads of its input, found in the policy's own syntax tree, and the decision cache's
key built from exactly that.

A decision is a function of the data and of the parts of the input the policy refers to. So two
inputs that agree on every path the policy reads get the same decision, and the cache may key on
those paths alone: a request that differs only in a field no rule looks at (its temperature, its
stream flag) is a hit. The paths come from regorus's AST of the loaded modules, never from a list
kept by hand: a rule that starts reading a field makes it part of the key at the next revision.

The analysis over-approximates, which keeps the key sound:
- a reference's path runs from `input` through its static keys (`input.request.route`,
  `input["request"]`) up to the first computed or numeric index, and everything under it counts
  as read (`input.request.messages[_].content` reads all of `request.messages`);
- `object.get(input.x, "k", default)` reads `x.k` (and `x.k1.k2` for a literal path array);
  any other use of a reference (a call, an iteration) reads all of it;
- a bare `input`, or an import of `input` as a whole, reads everything: the cache is then keyed
  on the whole input, as it was before;
- `with input… as …` replaces the input for the rules it calls, so its target is not a read;
- a policy that calls a builtin whose answer is not a function of its arguments (the clock,
  randomness, the network) is not cached at all.

An entrypoint reads only through the packages it can reach: its own package, and every package a
module of a reached package refers to under `data` (an import, a reference, a `with`). A reference
reaches a package when it names the package or anything inside it (`data.tenantgate.authz.deny`),
or names a package above it whole (`data.tenantgate`, `data`), or names a rule of a package above
it (so `data.tenantgate.tools.decision` reaches `tenantgate.tools`, not `tenantgate`, which has no
rule `tools`). So the tools decision's key leaves out what only its arguments package reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

Path = tuple[str, ...]
# Builtins whose result depends on something besides their arguments: a decision that calls one
# cannot be cached. io.jwt.decode_verify reads the clock unless a time is given.
UNCACHEABLE_BUILTINS = frozenset({
    "time.now_ns", "rand.intn", "uuid.rfc4122", "http.send", "net.lookup_ip_addr", "opa.runtime",
    "io.jwt.decode_verify",
})
_REFS = ("RefDot", "RefBrack")
# json.dumps(value, sort_keys=True, separators=(",", ":")), without building an encoder per call.
_KEY_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


@dataclass(frozen=True)
class InputReads:
    """The input paths a revision's modules read (no path a prefix of another; () is the whole
    input), and whether its decisions may be cached at all."""

    paths: frozenset[Path]
    cacheable: bool = True
    uncacheable_because: str = ""
    _trie: dict | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_trie", _trie(self.paths))

    @classmethod
    def whole(cls) -> InputReads:
        return cls(frozenset({()}))

    @property
    def reads_whole_input(self) -> bool:
        return () in self.paths

    def key(self, document: Mapping) -> str:
        """The document cut down to the paths read, as JSON with sorted keys: equal keys, equal
        decisions (JSON text, not Python values, so that 1, 1.0 and true stay apart)."""
        return _KEY_JSON(_project(document, self._trie))

    def identity(self, document: Mapping) -> tuple:
        """What the cache looks a decision up by: equal for two documents only when their keys are
        equal, and cheaper to make (a flat tuple of the values read, each with its type, where the key
        is JSON). The key is then made only for an evaluation, on a miss."""
        found: list = []
        _identify(document, self._trie, found)
        return tuple(found)

    def to_json(self) -> dict:
        return {"paths": sorted(self.paths), "cacheable": self.cacheable,
                "uncacheable_because": self.uncacheable_because}

    @classmethod
    def from_json(cls, value: Mapping) -> InputReads:
        return cls(frozenset(tuple(path) for path in value["paths"]), cacheable=value["cacheable"],
                   uncacheable_because=value["uncacheable_because"])


@dataclass
class _Package:
    rules: set[str | None] = field(default_factory=set)  # rule names; None: one whose name is not plain
    paths: set[Path] = field(default_factory=set)
    calls: set[str] = field(default_factory=set)
    refers: set[Path] = field(default_factory=set)  # static paths under `data`


def input_reads(asts: Iterable[Mapping], entrypoint: str | None = None) -> InputReads:
    """The reads of the modules whose ASTs are given (regorus `Engine.get_ast_as_json()`, parsed):
    all of them, or those of the packages `entrypoint` (`data.a.b.rule`) can reach."""
    packages: dict[Path, _Package] = {}
    for module in asts:
        ast = module.get("ast", module)
        package = packages.setdefault(_package_path(ast.get("package")), _Package())
        for imported in ast.get("imports", ()):
            path = _input_path(imported.get("refr"))
            if path is not None:
                package.paths.add(path)
            target = _data_path(imported.get("refr"))
            if target is not None:
                package.refers.add(target)
        for rule in ast.get("rules", ()):
            package.rules.add(_rule_name(rule))
            _walk(rule, package.paths, package.calls, package.refers)
    reached = _reached(packages, entrypoint) if entrypoint is not None else set()
    if not reached:  # every module: no entrypoint, or none that a package defines (it is then undefined)
        reached = set(packages)
    paths = set().union(*(packages[name].paths for name in reached))
    calls = set().union(*(packages[name].calls for name in reached))
    uncacheable = sorted(calls & UNCACHEABLE_BUILTINS)
    return InputReads(_minimal(paths), cacheable=not uncacheable,
                      uncacheable_because=", ".join(uncacheable))


def engine_reads(engine, entrypoint: str | None = None) -> InputReads:
    """The reads of the modules loaded into a regorus engine: all, or those `entrypoint` can reach."""
    return input_reads(json.loads(engine.get_ast_as_json()), entrypoint)


def _reached(packages: Mapping[Path, _Package], entrypoint: str) -> set[Path]:
    start = tuple(entrypoint.split("."))
    if start[0] != "data":
        raise ValueError(f"an entrypoint is a path under data, not {entrypoint!r}")
    reached: set[Path] = set()
    pending = [start[1:]]
    while pending:
        target = pending.pop()
        for name, package in packages.items():
            if name not in reached and _reaches(target, name, package):
                reached.add(name)
                pending.extend(package.refers)
    return reached


def _reaches(target: Path, name: Path, package: _Package) -> bool:
    """Whether a reference to data.<target> can read anything package <name> defines."""
    if target[:len(name)] != name:
        return name[:len(target)] == target  # the package lies under what the reference names whole
    if len(target) == len(name):
        return True
    return target[len(name)] in package.rules or None in package.rules


def _package_path(package: object) -> Path:
    """`package a.b` as ("a", "b"): its reference's root name, then its keys."""
    found = _static_reference(package.get("refr") if isinstance(package, dict) else None)
    if found is None or found[2]:
        raise ValueError("a module's package is not a plain path")
    root, keys, _ = found
    return (root, *keys)


def _rule_name(rule: Mapping) -> str | None:
    """The first name of a rule's head (`deny` of `deny contains x`, `a` of `a.b := 1`); None when
    the head is of a shape this does not know (such a package is reached by any of its paths)."""
    if "Default" in rule:
        head = rule["Default"].get("refr")
    elif "Spec" in rule:
        kinds = list(rule["Spec"].get("head", {}).values())  # {Compr|Set|Func: {refr, ...}}
        head = kinds[0].get("refr") if len(kinds) == 1 and isinstance(kinds[0], dict) else None
    else:
        return None
    found = _static_reference(head)
    return found[0] if found is not None else None


def _walk(node: object, paths: set[Path], calls: set[str], refers: set[Path]) -> None:
    if isinstance(node, list):
        for item in node:
            _walk(item, paths, calls, refers)
        return
    if not isinstance(node, dict):
        return
    if len(node) == 1:
        (kind, body), = node.items()
        if kind in _REFS or kind == "Var":
            _reference(node, paths, calls, refers)
            return
        if kind == "Call" and isinstance(body, dict):
            _call(body, paths, calls, refers)
            return
    for key, value in node.items():
        if key == "with_mods":
            for modifier in value or ():
                target = modifier.get("refr")
                if _input_path(target) is None:
                    _walk(target, paths, calls, refers)
                _walk(modifier.get("as"), paths, calls, refers)
        elif key not in ("span", "field"):
            _walk(value, paths, calls, refers)


def _reference(node: dict, paths: set[Path], calls: set[str], refers: set[Path]) -> None:
    """A reference: its static input path is read, its static data path recorded; its computed
    indexes are walked as expressions."""
    path = _input_path(node)
    if path is not None:
        paths.add(path)
    target = _data_path(node)
    if target is not None:
        refers.add(target)
    while True:
        (kind, body), = node.items()
        if kind == "RefBrack":
            _walk(body.get("index"), paths, calls, refers)
        if kind not in _REFS:
            return
        node = body["refr"]


def _call(call: dict, paths: set[Path], calls: set[str], refers: set[Path]) -> None:
    name = _dotted(call.get("fcn"))
    if name is not None:
        calls.add(name)
        if name.startswith("data."):  # another package's function (the package's own, and builtins, are not)
            refers.add(tuple(name.split(".")[1:]))
    params = call.get("params") or []
    if name == "object.get" and len(params) == 3:
        base, key = _input_path(params[0]), _literal_path(params[1])
        if base is not None and key is not None:
            paths.add(base + key)
            _walk(params[2], paths, calls, refers)
            return
    _walk(params, paths, calls, refers)


def _input_path(node: object) -> Path | None:
    """The static path of a reference rooted at `input` (None if it is not rooted there)."""
    return _rooted_path("input", node)


def _data_path(node: object) -> Path | None:
    """The static path of a reference rooted at `data` (None if it is not rooted there)."""
    return _rooted_path("data", node)


def _rooted_path(root: str, node: object) -> Path | None:
    found = _static_reference(node)
    return found[1] if found is not None and found[0] == root else None


def _static_reference(node: object) -> tuple[str, Path, bool] | None:
    """A reference's root name, its static keys after the root up to the last computed or numeric
    index (all of what is before such an index is read), and whether it had one; None for anything
    but a plain reference (a call's result, a literal)."""
    keys: list[str] = []
    computed = False
    while isinstance(node, dict) and len(node) == 1:
        (kind, body), = node.items()
        if kind == "Var":
            value = body.get("value")
            return (value, tuple(reversed(keys)), computed) if isinstance(value, str) else None
        if kind == "RefDot":
            keys.append(body["field"][1])
        elif kind == "RefBrack":
            index = body.get("index") or {}
            literal = index.get("String", {}).get("value") if isinstance(index, dict) else None
            if isinstance(literal, str):
                keys.append(literal)
            else:
                keys, computed = [], True
        else:
            return None
        node = body["refr"]
    return None


def _literal_path(node: object) -> Path | None:
    """object.get's key: a string literal, or an array of string literals (a path)."""
    if not isinstance(node, dict) or len(node) != 1:
        return None
    (kind, body), = node.items()
    if kind == "String" and isinstance(body.get("value"), str):
        return (body["value"],)
    if kind == "Array":
        items = [_literal_path(item) for item in body.get("items", ())]
        if items and all(item is not None and len(item) == 1 for item in items):
            return tuple(item[0] for item in items)  # type: ignore[index]  # checked just above
    return None


def _dotted(node: object) -> str | None:
    """A called function's name (`object.get`), when it is a plain dotted name."""
    names: list[str] = []
    while isinstance(node, dict) and len(node) == 1:
        (kind, body), = node.items()
        if kind == "Var":
            return ".".join([body.get("value", ""), *reversed(names)])
        if kind != "RefDot":
            return None
        names.append(body["field"][1])
        node = body["refr"]
    return None


def _minimal(paths: set[Path]) -> frozenset[Path]:
    """Drops every path under another one (reading `request` already reads `request.route`)."""
    kept: list[Path] = []
    for path in sorted(paths, key=len):
        if not any(path[:len(shorter)] == shorter for shorter in kept):
            kept.append(path)
    return frozenset(kept)


def _trie(paths: Iterable[Path]) -> dict | None:
    """{key: subtree}, None where everything from there down is read."""
    if () in paths:
        return None
    root: dict = {}
    for path in paths:
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = None
    return root


def _project(value: object, trie: dict | None) -> object:
    if trie is None or not isinstance(value, Mapping):
        return value  # read whole, or not an object (the policy sees it whole)
    return {key: _project(value[key], sub) for key, sub in trie.items() if key in value}


_OBJECT, _ABSENT, _ENCODED = object(), object(), object()  # markers no input value can equal


def _identify(value: object, trie: dict | None, found: list) -> None:
    """Appends what _project keeps of value: the walk is the trie's, so a position means one path, each
    object and each absent key is marked, and every value carries its type (True, 1 and 1.0 stay
    apart, as they do in JSON)."""
    if trie is not None and isinstance(value, Mapping):
        found.append(_OBJECT)
        for key, sub in trie.items():
            if key in value:
                _identify(value[key], sub, found)
            else:
                found.append(_ABSENT)
        return
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        found += (kind, value)
    elif isinstance(value, list) and all(type(item) is str for item in value):  # scopes, roles: JSON as a list's
        found += (list, tuple(value))
    elif kind is float:
        found += (float, repr(value))  # repr keeps -0.0 apart from 0.0, as JSON does
    else:
        found += (_ENCODED, _KEY_JSON(value))


def describe(reads: InputReads) -> Iterator[str]:
    """The paths, dotted, for logs and the CLI (paths are policy field names, never values)."""
    for path in sorted(reads.paths):
        yield "input" + "".join(f".{key}" for key in path)
