"""A schema's compilation, tried in a child process first, so that its time is bounded: llguidance's
JSON compiler has no limit of its own on some schemas (each pair of patternProperties regexes is
intersected, and a 16 KB schema can hold 1,600 of them: minutes of CPU), and a compilation cannot
be interrupted in the thread running it. A child can be killed. It builds what the engine would
(a matcher on the model's tokenizer) and answers with the library's error, or none; a schema that
compiled in the child within the bound compiles as fast in the engine.

`python -m engine.grammar_probe` is the child: it reads length-prefixed frames on stdin (first the
tokenizer, then one grammar each) and answers each on its stdout. Its stderr goes nowhere: what
llguidance prints may quote the schema.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import weakref
from pathlib import Path
from typing import IO, cast

_HEADER = struct.Struct(">I")
READY = b"ready"
START_TIMEOUT_S = 60.0  # an interpreter, llguidance and the tokenizer, on a loaded machine


class ProbeDied(RuntimeError):
    """The child exited (or could not start) without answering."""


class ProbeWorker:
    """One child process; not thread-safe (one probe at a time)."""

    def __init__(self, tokenizer_json: str, n_vocab: int, eos_token: int | None) -> None:
        self._process = subprocess.Popen([sys.executable, "-m", "engine.grammar_probe"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_child_env())
        # Both are pipes (PIPE above), never None.
        self._stdin, self._stdout = cast("IO[bytes]", self._process.stdin), cast("IO[bytes]", self._process.stdout)
        # At exit or once unreachable, the child goes too (and is waited for: no zombie, no warning).
        self._finalizer = weakref.finalize(self, _stop, self._process)
        init = {"tokenizer": tokenizer_json, "n_vocab": n_vocab, "eos_token": eos_token}
        self._started = False
        self._init = json.dumps(init).encode()

    def probe(self, grammar: str, timeout_s: float) -> str | None:
        """The library's error for the grammar ("" when it compiles), or None when compiling took
        longer than timeout_s: the child is then killed, and this worker is spent."""
        if not self._started:
            write_frame(self._stdin, self._init)
            if self._reply(START_TIMEOUT_S) != READY:
                raise ProbeDied("the grammar probe did not start")
            self._started = True
        write_frame(self._stdin, grammar.encode())
        reply = self._reply(timeout_s)
        if reply is None:
            self.close()
            return None
        return reply.decode()

    def close(self) -> None:
        self._finalizer()

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def _reply(self, timeout_s: float) -> bytes | None:
        ready, _, _ = select.select([self._stdout], [], [], timeout_s)
        if not ready:
            return None
        reply = read_frame(self._stdout)
        if reply is None:
            self.close()
            raise ProbeDied("the grammar probe exited")
        return reply


def _child_env() -> dict[str, str]:
    # The child imports this very engine package, wherever this process found it.
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return os.environ | {"PYTHONPATH": path}


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            pipe.close()


def write_frame(pipe: IO[bytes], payload: bytes) -> None:
    try:
        pipe.write(_HEADER.pack(len(payload)) + payload)
        pipe.flush()
    except (BrokenPipeError, ValueError):  # the child is gone (ValueError: the pipe was closed here)
        raise ProbeDied("the grammar probe exited") from None


def read_frame(pipe: IO[bytes]) -> bytes | None:
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    payload = pipe.read(size)
    return payload if len(payload) == size else None


def main() -> None:
    import llguidance

    requests, replies = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing else may write into the replies
    init = json.loads(read_frame(requests) or b"null")
    tokenizer = llguidance.LLTokenizer(init["tokenizer"], n_vocab=init["n_vocab"], eos_token=init["eos_token"])
    write_frame(replies, READY)
    while (grammar := read_frame(requests)) is not None:
        matcher = llguidance.LLMatcher(tokenizer, grammar.decode(), log_level=0)
        write_frame(replies, (matcher.get_error() if matcher.is_error() else "").encode())


if __name__ == "__main__":
    main()
