"""A policy revision checked and cut into slices, so that the event loop can build its engine a
slice at a time.

A regorus Engine holds the GIL for all of its work (parsing JSON data, merging it) and is bound
to the thread that made it; Python's JSON parser and the revision digest hold the GIL too. A
reload built on a worker thread therefore still stalls the loop, and its engine cannot be handed
over. So a reload prepares the revision in a process of its own (a fresh interpreter started
with `-c`, not multiprocessing: nothing of the parent's __main__ runs there): it reads, parses and
digests the files and decides every sample with an engine of its own. The loop then builds its
engine from the prepared slices, yielding after each one: no step costs the loop more than one
slice of data, whatever the number of tenants.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from gateway.policy.exceptions import PolicyError, PolicyEvaluationError
from gateway.policy.loader import (
    ARGUMENTS_ENTRYPOINT,
    ENTRYPOINT,
    TOOLS_ENTRYPOINT,
    add_policy,
    load_samples,
    load_source,
    raw_decision,
)
from gateway.policy.reads import InputReads, engine_reads
from gateway.policy.schema import validate_decision

SLICE_BYTES = 64 * 1024  # of data JSON per slice: well under a millisecond of regorus' time


@dataclass(frozen=True)
class PreparedPolicy:
    """What the loop needs of a checked revision: its digest, the module texts, the data as JSON
    slices that merge into the whole document, the registered tenants and the enabled ones, and
    what its request, tools and arguments entrypoints read of the input (reads.py)."""

    revision: str
    modules: dict[str, str]
    data_slices: tuple[str, ...]
    tenant_ids: frozenset[str]
    enabled_tenant_ids: frozenset[str] = frozenset()  # those whose data says enabled: true
    reads: InputReads = InputReads.whole()
    tools_reads: InputReads = InputReads.whole()
    arguments_reads: InputReads = InputReads.whole()


def checked(policy_dir: Path, data_dir: Path | None = None) -> tuple[PreparedPolicy, object]:
    """Loads a revision, builds its engine and decides every sample in policy_dir/samples with it
    (each decision must validate: a revision that parses but cannot decide, a rule conflict say,
    is refused with a PolicyError). Returns the prepared revision and the engine."""
    source = load_source(policy_dir, data_dir)
    tenants = source.data.get("tenants")
    prepared = PreparedPolicy(
        revision=source.revision,
        modules=source.modules,
        data_slices=tuple(data_slices(source.data)),
        tenant_ids=frozenset(tenants) if isinstance(tenants, dict) else frozenset(),
        enabled_tenant_ids=frozenset(tid for tid, tenant in tenants.items()
                                     if isinstance(tenant, dict) and tenant.get("enabled") is True)
        if isinstance(tenants, dict) else frozenset(),
    )
    del source, tenants
    engine = build_engine(prepared)
    prepared = replace(prepared, reads=engine_reads(engine, ENTRYPOINT),
                       tools_reads=engine_reads(engine, TOOLS_ENTRYPOINT),
                       arguments_reads=engine_reads(engine, ARGUMENTS_ENTRYPOINT))
    samples = load_samples(Path(policy_dir)).items()
    problem = next((p for name, (_, sample) in samples if (p := _sample_problem(engine, name, sample["input"]))), None)
    if problem is not None:
        del engine  # on this thread, and before the error is raised (see loader.new_engine)
        raise PolicyError(problem)
    return prepared, engine


# The reload's process: the parent's import path, then the directories. It writes one header line
# (the revision, modules and tenants, or why the revision is refused), then one line per data slice.
_PREPARE = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
            "from gateway.policy.prepared import prepare_main; prepare_main(sys.argv[2], sys.argv[3])")
_NICENESS = 10
_LINE_LIMIT = 1 << 30  # a line is a slice, or the header with every tenant id: bounded by the policy data itself


def prepare_main(policy_dir: str, data_dir: str) -> None:
    """The reload process' body."""
    os.nice(_NICENESS)  # background work: the serving process comes first for the CPU
    write_prepared(policy_dir, data_dir, sys.stdout.buffer)


def write_prepared(policy_dir: str, data_dir: str, out: BinaryIO) -> None:
    try:
        prepared, _engine = checked(Path(policy_dir), Path(data_dir))
    except PolicyError as exc:
        out.write(json.dumps({"refused": str(exc)}).encode() + b"\n")
        return
    header = {"revision": prepared.revision, "modules": prepared.modules, "tenants": sorted(prepared.tenant_ids),
              "enabled": sorted(prepared.enabled_tenant_ids), "slices": len(prepared.data_slices),
              "reads": prepared.reads.to_json(), "tools_reads": prepared.tools_reads.to_json(),
              "arguments_reads": prepared.arguments_reads.to_json()}
    out.write(json.dumps(header).encode() + b"\n")
    for text in prepared.data_slices:  # ASCII JSON (json.dumps escapes the rest): never a newline inside
        out.write(text.encode() + b"\n")
    out.flush()


async def prepare_elsewhere(policy_dir: Path, data_dir: Path) -> PreparedPolicy:
    """checked() in a process of its own: its parsing and digesting hold that process' GIL, not
    this one's. What comes back is read as it arrives; a refused revision raises PolicyError."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PREPARE, json.dumps(sys.path), str(policy_dir), str(data_dir),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        limit=_LINE_LIMIT)
    errors = asyncio.ensure_future(process.stderr.read())  # type: ignore[union-attr]  # stderr=PIPE
    try:
        prepared = await _read_prepared(process.stdout)  # type: ignore[arg-type]  # stdout=PIPE
        code = await process.wait()
    finally:
        if process.returncode is None:  # cancelled mid-read (the gateway stops)
            process.kill()
            await process.wait()
        detail = await errors
    if prepared is None or code != 0:
        lines = detail.decode(errors="replace").strip().splitlines()
        raise PolicyError(f"the policy preparation process failed (exit {code}): {lines[-1] if lines else 'no output'}")
    return prepared


async def _read_prepared(stream: asyncio.StreamReader) -> PreparedPolicy | None:
    line = await stream.readline()
    if not line:
        return None
    header = json.loads(line)
    if "refused" in header:
        raise PolicyError(header["refused"])
    slices = []
    for _ in range(header["slices"]):
        line = await stream.readline()
        if not line.endswith(b"\n"):
            return None  # cut short
        slices.append(line[:-1].decode())
    return PreparedPolicy(revision=header["revision"], modules=header["modules"], data_slices=tuple(slices),
                          tenant_ids=frozenset(header["tenants"]), enabled_tenant_ids=frozenset(header["enabled"]),
                          reads=InputReads.from_json(header["reads"]),
                          tools_reads=InputReads.from_json(header["tools_reads"]),
                          arguments_reads=InputReads.from_json(header["arguments_reads"]))


def _sample_problem(engine, name: str, input_document: dict) -> str | None:
    try:
        decision = json.loads(raw_decision(engine, json.dumps(input_document)))
        if decision is None:
            raise PolicyEvaluationError(f"{ENTRYPOINT} is undefined")
        validate_decision(decision)
    except PolicyError as exc:
        return f"sample {name} gets no valid decision: {exc}"
    return None


def data_slices(data: dict, slice_bytes: int = SLICE_BYTES) -> Iterator[str]:
    """The data document as JSON objects that merge back into it: each top-level object (the
    tenants) cut between its members, every slice but a single oversized member under slice_bytes."""
    for key, value in data.items():
        if not isinstance(value, dict) or not value:
            yield json.dumps({key: value})
            continue
        members: list[str] = []
        size = 0
        for member, item in value.items():
            text = f"{json.dumps(member)}:{json.dumps(item)}"
            if members and size + len(text) > slice_bytes:
                yield _object_slice(key, members)
                members, size = [], 0
            members.append(text)
            size += len(text) + 1
        yield _object_slice(key, members)


def _object_slice(key: str, members: list[str]) -> str:
    return f"{{{json.dumps(key)}:{{{','.join(members)}}}}}"


def engine_steps(prepared: PreparedPolicy) -> Iterator[object]:
    """Builds an engine a bounded step at a time (a module, or a slice of data); the last value
    yielded is the engine."""
    import regorus

    engine = regorus.Engine()
    for path, text in prepared.modules.items():
        error = add_policy(engine, path, text)
        if error is not None:
            del engine  # see new_engine
            raise error
        yield None
    for text in prepared.data_slices:
        engine.add_data_json(text)
        yield None
    yield engine


def build_engine(prepared: PreparedPolicy):
    """The engine, built in one go (at startup, before anything is served)."""
    *_, engine = engine_steps(prepared)
    return engine


async def build_engine_cooperatively(prepared: PreparedPolicy):
    """The engine, built on the calling loop's thread, which answers other tasks between steps."""
    engine = None
    for engine in engine_steps(prepared):  # noqa: B007 - the last step yields the built engine
        await asyncio.sleep(0)
    return engine
