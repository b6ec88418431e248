"""One audit record per request: digests and numbers, never content.

`AuditTrail` chains the records, signs the chain with Ed25519 at checkpoints, writes it
to sinks (stdout, a rotating file, a Redis Stream) and anchors its head in a second store;
`verify.py` finds the first altered, deleted or reordered entry, and with the anchors what was
cut from or added to a chain's end.
"""

from gateway.audit.recorder import AuditRecorder, digest_label
from gateway.audit.sinks import (
    RedisStreamSink,
    RotatingFileSink,
    StreamSink,
    read_stream,
    rotated_files,
    trail_files,
    worker_file,
)
from gateway.audit.trail import AuditSink, AuditTrail, boot_chain_id, load_or_create_signing_key, public_key_pem
from gateway.audit.verify import VerifyReport, key_id, load_public_key, verify_files
from gateway.encoding import canonical_json

__all__ = [
    "AuditRecorder",
    "AuditSink",
    "AuditTrail",
    "RedisStreamSink",
    "RotatingFileSink",
    "StreamSink",
    "VerifyReport",
    "boot_chain_id",
    "canonical_json",
    "digest_label",
    "key_id",
    "load_or_create_signing_key",
    "load_public_key",
    "public_key_pem",
    "read_stream",
    "rotated_files",
    "trail_files",
    "worker_file",
    "verify_files",
]
