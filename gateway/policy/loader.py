"""Finds the Rego files and data documents of a policy directory, the way OPA loads them.

A policy directory holds `*.rego` modules (tests end in `_test.rego`) and JSON data.
Like `opa run DIR`, a JSON file is merged into data at its directory's path relative to
the root (`policies/samples/x.json` lands at `data.samples`); a data directory given on
its own (`--data DIR`) is loaded at the root of data.
"""

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from gateway.encoding import canonical_json
from gateway.policy.exceptions import PolicyError, PolicyEvaluationError, PolicySyntaxError

ENTRYPOINT = "data.tenantgate.decision"
TOOLS_ENTRYPOINT = "data.tenantgate.tools.decision"  # MCP tools/list and tools/call
ARGUMENTS_ENTRYPOINT = "data.tenantgate.tools.arguments.denials"  # a tools/call the tools decision allows
DEFAULT_POLICY_DIR = Path(__file__).resolve().parents[2] / "policies"

_ERROR_LOCATION = re.compile(r"-->\s*(?P<path>.+?):(?P<line>\d+):(?P<col>\d+)")
_ERROR_MESSAGE = re.compile(r"^error:\s*(?P<message>.+)$", re.MULTILINE)


@dataclass(frozen=True)
class PolicySource:
    """What an engine needs: module texts by path and the data document, plus their digest."""

    modules: dict[str, str]
    data: dict
    revision: str


def rego_files(root: Path, *, include_tests: bool) -> list[Path]:
    files = sorted(p for p in root.rglob("*.rego") if p.is_file())
    if not include_tests:
        files = [p for p in files if not p.name.endswith("_test.rego")]
    return files


def _merge(target: dict, value: object, where: str) -> None:
    if not isinstance(value, dict):
        raise PolicyError(f"{where}: a data file must hold a JSON object")
    for key, item in value.items():
        if key in target and isinstance(target[key], dict) and isinstance(item, dict):
            _merge(target[key], item, where)
        elif key in target:
            raise PolicyError(f"{where}: data conflict at key {key!r}")
        else:
            target[key] = item


def load_data_tree(root: Path, *, at_root: bool) -> dict:
    """Merges every JSON file under root; at its directory's path unless at_root."""
    data: dict = {}
    for path in sorted(root.rglob("*.json")):
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise PolicyError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
        node = data
        if not at_root:
            for part in path.parent.relative_to(root).parts:
                node = node.setdefault(part, {})
        _merge(node, value, str(path))
    return data


def load_source(
    policy_dir: Path = DEFAULT_POLICY_DIR,
    data_dir: Path | None = None,
    *,
    include_tests: bool = False,
) -> PolicySource:
    """Loads the modules of policy_dir and the data of data_dir (default: policy_dir/data).

    With include_tests, data is loaded the way `opa test DIR` loads it (the whole tree at
    directory paths), so tests can read samples and example tenants.
    """
    policy_dir = Path(policy_dir)
    if not policy_dir.is_dir():
        raise PolicyError(f"{policy_dir}: no such policy directory")
    modules = {
        str(path): path.read_text(encoding="utf-8")
        for path in rego_files(policy_dir, include_tests=include_tests)
    }
    if not modules:
        raise PolicyError(f"{policy_dir}: no .rego files found")
    if include_tests:
        data = load_data_tree(policy_dir, at_root=False)
    else:
        data = load_data_tree(Path(data_dir) if data_dir else policy_dir / "data", at_root=True)
    return PolicySource(modules=modules, data=data, revision=revision_of(modules, data, policy_dir))


def load_samples(policy_dir: Path) -> dict[str, tuple[Path, dict]]:
    """The samples in policy_dir/samples (none if it has no such folder): name -> (file, sample),
    each sample an object with an `input` document (and, for tests, the `expected` decision)."""
    samples = {}
    for path in sorted((Path(policy_dir) / "samples").glob("*.json")):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise PolicyError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
        if not isinstance(document, dict):
            raise PolicyError(f"{path}: a samples file must hold a JSON object of named samples")
        for name, sample in document.items():
            if not isinstance(sample, dict) or not isinstance(sample.get("input"), dict):
                raise PolicyError(f"{path}: sample {name!r} has no input object")
            samples[name] = (path, sample)
    return samples


def revision_of(modules: dict[str, str], data: dict, root: Path) -> str:
    """A content digest over module paths (relative to root), module text and data."""
    digest = hashlib.sha256()
    for path in sorted(modules):
        digest.update(Path(path).relative_to(root).as_posix().encode() + b"\0")
        digest.update(modules[path].encode() + b"\0")
    try:
        digest.update(canonical_json(data).encode())
    except ValueError:  # NaN or Infinity, which Python's json reads but JSON does not allow
        raise PolicyError("policy data holds NaN or Infinity, which JSON does not allow") from None
    return "sha256:" + digest.hexdigest()


def syntax_error(exc: Exception, fallback_path: str) -> PolicySyntaxError:
    """Turns a regorus parse error into a PolicySyntaxError with file:line and message."""
    text = str(exc).split("Stack backtrace:")[0]
    location = _ERROR_LOCATION.search(text)
    message = _ERROR_MESSAGE.search(text)
    return PolicySyntaxError(
        location.group("path") if location else fallback_path,
        int(location.group("line")) if location else 0,
        message.group("message").strip() if message else text.strip(),
    )


def new_engine(source: PolicySource):
    """A regorus Engine with every module and the data added; syntax errors raise."""
    import regorus

    engine = regorus.Engine()
    for path, text in source.modules.items():
        error = add_policy(engine, path, text)
        if error is not None:
            # Raised from a frame that no longer holds the engine: the traceback would keep the
            # half-built engine alive, to die on whichever thread drops the error (pyo3 leaks it there).
            del engine
            raise error
    engine.add_data(source.data)
    return engine


def add_policy(engine, path: str, text: str) -> PolicySyntaxError | None:
    """Adds one module; a syntax error is returned, for the caller to raise once it has let go of the engine."""
    try:
        engine.add_policy(path, text)
    except RuntimeError as exc:
        return syntax_error(exc, path)
    return None


def raw_decision(engine, input_json: str, entrypoint: str = ENTRYPOINT) -> str:
    """The decision JSON for one input. An error leaves the engine as good as before (regorus resets
    its evaluation state at the start of each evaluation), so the caller keeps it."""
    try:
        engine.set_input_json(input_json)
        return engine.eval_rule_as_json(entrypoint)
    except (RuntimeError, ValueError) as exc:
        lines = str(exc).split("Stack backtrace:")[0].strip().splitlines()
        message = lines[-1] if lines else type(exc).__name__
    del engine
    raise PolicyEvaluationError(f"policy evaluation failed: {message}")
