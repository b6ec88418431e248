"""The engine as a network service: the wire format, envelope tokens, the HTTP edge every listener
of the product goes through, the server and its CLI."""

from engine.remote.edge import (
    NO_NATIVE_TELEMETRY,
    EdgeLimits,
    EdgeRefusal,
    edge_config,
    new_edge_request_id,
    read_body,
)
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
    "NO_NATIVE_TELEMETRY",
    "EdgeLimits",
    "EdgeRefusal",
    "ENVELOPE_HEADER",
    "GENERATE_PATH",
    "INFO_PATH",
    "LOAD_PATH",
    "MAX_TTL_S",
    "REJECTION_REASONS",
    "EnvelopeRejected",
    "EnvelopeSigner",
    "EnvelopeVerifier",
    "edge_config",
    "envelope_from_json",
    "envelope_to_json",
    "key_id",
    "load_private_key",
    "load_public_keys",
    "new_edge_request_id",
    "output_from_json",
    "output_to_json",
    "params_from_json",
    "params_to_json",
    "read_body",
    "record_from_json",
    "record_to_json",
]
