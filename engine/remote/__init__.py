"""The engine as a network service: the wire format, envelope tokens, the server and its CLI."""

from engine.remote.protocol import (
    ENVELOPE_HEADER,
    GENERATE_PATH,
    INFO_PATH,
    LOAD_PATH,
    envelope_from_json,
    envelope_to_json,
    output_from_json,
    output_to_json,
    params_from_json,
    params_to_json,
    record_from_json,
    record_to_json,
)
from engine.remote.signing import (
    MAX_TTL_S,
    REJECTION_REASONS,
    EnvelopeRejected,
    EnvelopeSigner,
    EnvelopeVerifier,
    key_id,
    load_private_key,
    load_public_keys,
)

__all__ = [
    "ENVELOPE_HEADER",
    "GENERATE_PATH",
    "INFO_PATH",
    "LOAD_PATH",
    "MAX_TTL_S",
    "REJECTION_REASONS",
    "EnvelopeRejected",
    "EnvelopeSigner",
    "EnvelopeVerifier",
    "envelope_from_json",
    "envelope_to_json",
    "key_id",
    "load_private_key",
    "load_public_keys",
    "output_from_json",
    "output_to_json",
    "params_from_json",
    "params_to_json",
    "record_from_json",
    "record_to_json",
]
