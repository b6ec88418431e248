"""`tenantgate cache segment`: the digest and length of a public prefix segment, for policy data.

    tenantgate cache segment --model smollm2-135m-instruct --messages system.json [--tools tools.json]
    tenantgate cache segment --model smollm2-135m-instruct --text prompt.txt

A segment is an exact token sequence: the conversation's opening messages rendered by the model's
chat template (without a generation prompt), or a completion prompt's text. The command checks
that the rendering is a prefix of the same conversation with one more user turn, since only then
do requests that go on from it start with these tokens, and prints the JSON object that
`data.platform_segments` (or a tenant's `cache_segments.own`) takes: digest, tokens, and for the
reader, the whole blocks shared. docs/policy-reference.md, "Public prefix segments".

Exit codes: 0 printed, 2 unusable arguments or input (or the rendering is no prefix).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gateway.deployments.config import read_json_file

EXIT_OK, EXIT_USAGE = 0, 2
PROBE_TURN = {"role": "user", "content": "?"}  # any next turn: the segment must be a prefix of what follows


def add_parser(commands: argparse._SubParsersAction) -> None:
    """`segment` under `tenantgate cache` (gateway/cache/cli.py)."""
    segment = commands.add_parser("segment", help="digest and length of a public prefix segment",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    segment.add_argument("--model", default=None, help="model whose tokenizer and chat template render it "
                                                       "(default: the engine's default model)")
    source = segment.add_mutually_exclusive_group(required=True)
    source.add_argument("--messages", type=Path, help="JSON array of the conversation's opening messages")
    source.add_argument("--text", type=Path, help="a completion prompt's opening text (UTF-8)")
    segment.add_argument("--tools", type=Path, help="JSON array of tools rendered with the messages")
    segment.set_defaults(func=_segment)


def _read_json_array(path: Path, what: str) -> list:
    value = json.loads(read_json_file(path, f"{what} file", ValueError))
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"{what}: {path} must hold a JSON array of objects")
    return value


def segment_tokens(tokenizer, messages: list[dict] | None = None, tools: list[dict] | None = None,
                   text: str | None = None) -> list[int]:
    """The segment's token ids; ValueError when what follows it would not start with them."""
    if text is not None:
        ids = tokenizer.encode(text)
        following = tokenizer.encode(text + "\n?")
    else:
        if not messages:
            raise ValueError("--messages: the segment needs at least one message")
        ids = tokenizer.encode_chat(messages, add_generation_prompt=False, tools=tools)
        following = tokenizer.encode_chat([*messages, PROBE_TURN], add_generation_prompt=True, tools=tools)
    if following[: len(ids)] != ids:
        raise ValueError("the rendering is not a prefix of what follows it (the template or the tokenizer joins "
                         "across the boundary): requests would never start with these tokens")
    return ids


def _segment(args: argparse.Namespace) -> int:
    from engine import DEFAULT_MODEL, EngineConfig, Tokenizer, resolve_model_path, segment_digest

    tools = _read_json_array(args.tools, "--tools") if args.tools else None
    messages = _read_json_array(args.messages, "--messages") if args.messages else None
    text = None
    if args.text is not None:
        try:
            text = args.text.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--text: cannot read {args.text}: {exc}") from None
    tokenizer = Tokenizer.from_dir(resolve_model_path(args.model or DEFAULT_MODEL, progress=False))
    ids = segment_tokens(tokenizer, messages, tools, text)
    block_size = EngineConfig.block_size
    print(json.dumps({
        "digest": segment_digest(ids).hex(),
        "tokens": len(ids),
        "shared_tokens": len(ids) // block_size * block_size,  # the whole blocks, at the engine's block size
    }))
    if len(ids) < block_size:
        print(f"tenantgate: note: {len(ids)} tokens fill no whole block of {block_size}; nothing would be shared",
              file=sys.stderr)
    return EXIT_OK
