"""Random ids read a block at a time: as random as os.urandom's, never repeated, of the shapes
the callers used before (uuid4's hex and text), and never shared with a forked child."""

from __future__ import annotations

import os
import re
import uuid

from engine.ids import BLOCK_BYTES, random_bytes, random_hex, random_uuid


def test_ids_are_distinct_across_blocks() -> None:
    ids = [random_hex() for _ in range(3 * BLOCK_BYTES // 16)]  # three blocks' worth
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def test_a_uuid_is_a_version_4_uuid_in_its_text_form() -> None:
    for _ in range(1000):
        text = random_uuid()
        parsed = uuid.UUID(text)
        assert (str(parsed), parsed.version, parsed.variant) == (text, 4, uuid.RFC_4122)


def test_more_than_a_block_at_once_is_read_whole() -> None:
    assert len(random_bytes(BLOCK_BYTES + 7)) == BLOCK_BYTES + 7


def test_a_forked_child_does_not_hand_out_its_parents_ids() -> None:
    random_hex()  # the parent holds a block it has only begun
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.write(write, random_hex().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    childs = os.read(read, 64).decode()
    os.close(read)
    assert len(childs) == 32 and childs != random_hex()
