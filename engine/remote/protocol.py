"""The wire format between the gateway and an engine server: JSON for envelopes, decode
settings, output deltas and execution records, one pair of functions each, used by both sides.

Every `*_from_json` refuses unknown or missing fields and wrong types with a ValueError
that names the field, never its value: a peer of another version fails loudly.
"""

from __future__ import annotations

import dataclasses

from engine.envelope import CacheScope, ExecutionEnvelope, Isolation, PublicSegment
from engine.outputs import RequestOutput, TokenLogprobs
from engine.sampling_params import SamplingParams
from engine.telemetry import RequestRecord

ENVELOPE_HEADER = "X-Tenantgate-Envelope"
GENERATE_PATH = "/v1/engine/generate"
LOAD_PATH = "/v1/engine/load"
INFO_PATH = "/v1/engine/info"
# The generate response: one JSON object per line (application/x-ndjson), each with a "type":
# "output" (a RequestOutput delta), then "record" (the x-record) after the finished output, or
# "error" when the engine failed mid-stream. A stream ending without a finished output was cut.
NDJSON = "application/x-ndjson"

_ENVELOPE_FIELDS = {f.name for f in dataclasses.fields(ExecutionEnvelope)}
_SEGMENT_FIELDS = {f.name for f in dataclasses.fields(PublicSegment)}
# keep_logits is for in-process tests only: raw logit rows never travel.
_PARAMS_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)} - {"keep_logits"}
_RECORD_FIELDS = {f.name for f in dataclasses.fields(RequestRecord)}


def _fields(document: object, expected: set[str], what: str) -> dict:
    if not isinstance(document, dict):
        raise ValueError(f"{what} must be a JSON object")
    unknown, missing = set(document) - expected, expected - set(document)
    if unknown:
        raise ValueError(f"{what} has unknown fields: {', '.join(sorted(unknown))}")
    if missing:
        raise ValueError(f"{what} lacks fields: {', '.join(sorted(missing))}")
    return document


def _hex(value: object, name: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"envelope.{name} must be a hex string")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise ValueError(f"envelope.{name} must be a hex string") from None


def envelope_to_json(envelope: ExecutionEnvelope) -> dict:
    return {
        "cache_namespace": envelope.cache_namespace.hex() if envelope.cache_namespace is not None else None,
        "cache_scope": envelope.cache_scope.value,
        "isolation": envelope.isolation.value,
        "isolation_key": envelope.isolation_key.hex(),
        "deterministic": envelope.deterministic,
        "kv_block_quota": envelope.kv_block_quota,
        "priority": envelope.priority,
    } | ({"speculative": True} if envelope.speculative else {}) | (  # so a replica from before them takes the rest
        {"public_segments": [{"digest": s.digest.hex(), "num_tokens": s.num_tokens, "namespace": s.namespace.hex()}
                             for s in envelope.public_segments]} if envelope.public_segments else {})


def envelope_from_json(document: object) -> ExecutionEnvelope:
    if isinstance(document, dict):  # from a gateway before them: no speculation, no public segments
        document = {"speculative": False, "public_segments": []} | document
    d = _fields(document, _ENVELOPE_FIELDS, "envelope")
    for flag in ("deterministic", "speculative"):
        if not isinstance(d[flag], bool):
            raise ValueError(f"envelope.{flag} must be a boolean")
    for name in ("kv_block_quota", "priority"):
        if type(d[name]) is not int:
            raise ValueError(f"envelope.{name} must be an integer")
    try:
        scope, isolation = CacheScope(d["cache_scope"]), Isolation(d["isolation"])
    except ValueError:
        raise ValueError("envelope.cache_scope or envelope.isolation is not a known value") from None
    namespace = d["cache_namespace"]
    if not isinstance(d["public_segments"], list):
        raise ValueError("envelope.public_segments must be a list")
    segments = []
    for segment in d["public_segments"]:
        s = _fields(segment, _SEGMENT_FIELDS, "envelope.public_segments[]")
        if type(s["num_tokens"]) is not int:
            raise ValueError("envelope.public_segments[].num_tokens must be an integer")
        segments.append(PublicSegment(digest=_hex(s["digest"], "public_segments[].digest"),
                                      num_tokens=s["num_tokens"],
                                      namespace=_hex(s["namespace"], "public_segments[].namespace")))
    return ExecutionEnvelope(  # its own checks (digest sizes, scope none without a namespace) still run
        cache_namespace=None if namespace is None else _hex(namespace, "cache_namespace"),
        cache_scope=scope,
        isolation=isolation,
        isolation_key=_hex(d["isolation_key"], "isolation_key"),
        deterministic=d["deterministic"],
        kv_block_quota=d["kv_block_quota"],
        priority=d["priority"],
        public_segments=tuple(segments),
        speculative=d["speculative"],
    )


def params_to_json(params: SamplingParams) -> dict:
    if params.keep_logits:
        raise ValueError("keep_logits is for in-process use; raw logits do not travel")
    d = {name: getattr(params, name) for name in _PARAMS_FIELDS}
    if params.n == 1:
        del d["n"]  # so a replica from before n > 1 still takes one-choice requests
    return d | {"stop": list(params.stop), "stop_token_ids": list(params.stop_token_ids)}


def params_from_json(document: object) -> SamplingParams:
    """A SamplingParams (its own checks raise SamplingParamsError, a ValueError naming the field)."""
    if not isinstance(document, dict):
        raise ValueError("params must be a JSON object")
    unknown = set(document) - _PARAMS_FIELDS
    if unknown:
        raise ValueError(f"params has unknown fields: {', '.join(sorted(unknown))}")
    return SamplingParams(**document)


def output_to_json(output: RequestOutput) -> dict:
    return {
        "type": "output",
        "new_token_ids": output.new_token_ids,
        "new_text": output.new_text,
        "num_prompt_tokens": output.num_prompt_tokens,
        "num_output_tokens": output.num_output_tokens,
        "num_cached_tokens": output.num_cached_tokens,
        "finished": output.finished,
        "finish_reason": output.finish_reason,
        "logprobs": [[lp.token_id, lp.logprob, [list(t) for t in lp.top]] for lp in output.logprobs],
        "index": output.index,
    }


def output_from_json(document: dict, request_id: str) -> RequestOutput:
    """A delta from the server; a malformed one raises ValueError (or TypeError, KeyError)."""
    ids = document["new_token_ids"]
    if not isinstance(ids, list) or not all(type(t) is int for t in ids):
        raise ValueError("new_token_ids must be a list of integers")
    if not isinstance(document["new_text"], str):
        raise ValueError("new_text must be a string")
    return RequestOutput(
        request_id=request_id,
        new_token_ids=ids,
        new_text=document["new_text"],
        num_prompt_tokens=int(document["num_prompt_tokens"]),
        num_output_tokens=int(document["num_output_tokens"]),
        num_cached_tokens=int(document["num_cached_tokens"]),
        finished=bool(document["finished"]),
        finish_reason=document["finish_reason"],
        logprobs=[TokenLogprobs(int(t), float(lp), tuple((int(i), float(p)) for i, p in top))
                  for t, lp, top in document["logprobs"]],
        index=int(document.get("index", 0)),
    )


def record_to_json(record: RequestRecord) -> dict:
    return dataclasses.asdict(record)


def record_from_json(document: object) -> RequestRecord:
    if isinstance(document, dict):  # a replica from before speculation counted none
        document = {"draft_tokens": 0, "accepted_tokens": 0} | document
    d = _fields(document, _RECORD_FIELDS, "record")
    return RequestRecord(**(d | {"top_margins": tuple(d["top_margins"]), "finish_reasons": tuple(d["finish_reasons"])}))
