"""The gateway's side of the audit trail: one record per judged request.

A record says who asked (keyed digests of tenant and principal, never the ids), under
which policy revision, what was decided, what ran (the engine's x-record: digests and
numbers), usage, latency and outcome. Content appears only when the tenant's decision
says `redacted`, and then only after the decision's JSON pointers are removed and the
detectors have replaced secrets and PII. Bearer tokens are never part of a record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from engine import isolation_key, keyed_digest, random_uuid, tenant_digest
from gateway.audit.trail import AuditRefused, AuditTrail
from gateway.errors import AuditUnavailable

# How long a finished request waits for the engine's x-record (an abort is recorded by the
# engine thread a moment after the caller has gone).
ENGINE_RECORD_WAIT_S = 2.0

DIGEST_LABEL_CHARS = 12  # enough to tell tenants apart on a dashboard, short enough for a label


def digest_label(digest: str) -> str:
    """A tenant's (or principal's) digest as metric labels, spans and the operator console show it:
    the first characters of the full digest that audit records and quota keys carry, so they join."""
    return digest[:DIGEST_LABEL_CHARS]


class AuditRecorder:
    def __init__(self, trail: AuditTrail | None, key: bytes, redactor=None) -> None:
        self.trail = trail
        self._key = key
        self.redactor = redactor
        self.pending: set[asyncio.Task] = set()

    def digest(self, value: str) -> str:
        # The engine's keyed digest (HMAC-SHA256, remembered for the values seen lately: a request
        # asks for its principal's several times, for its records and its quota keys).
        return keyed_digest(self._key, "audit:" + value).hex()[:32]

    def tenant_digest(self, tenant_id: str) -> str:
        """The engine's tag of the tenant (its step records show the same), under this recorder's key."""
        return tenant_digest(isolation_key(self._key, tenant_id))

    def principal_digests(self, principal) -> dict:
        """The tenant's and the principal's digest: audit records, quota keys and metric labels use these."""
        return {"tenant": self.tenant_digest(principal.tenant_id),
                "principal": self.digest(f"principal:{principal.tenant_id}:{principal.object_id}")}

    @property
    def accepting(self) -> bool:
        """Whether new requests may start: every sink can take their records (see AuditTrail.accepting)."""
        return self.trail is None or self.trail.accepting

    def write(self, record: dict) -> dict | None:
        """Appends the record; AuditUnavailable when the trail cannot keep it (the caller must then
        not acknowledge the request it describes)."""
        if self.trail is None:
            return None
        try:
            return self.trail.append({"decision_id": random_uuid(), "time": round(time.time(), 3), **record})
        except AuditRefused:
            raise AuditUnavailable() from None

    def content(self, decision, request_body: dict, response_text: str | list[str] | None) -> dict | None:
        """The request and response as the decision allows them in a record: None unless the
        logging content is "redacted", then with its pointers removed and detectors applied.
        response_text: the one choice's text, or each choice's in order."""
        if decision.logging.content != "redacted" or self.redactor is None:
            return None
        texts = [response_text] if isinstance(response_text, str) else response_text
        document = {"request": request_body,
                    "response": {"choices": [{"text": text} for text in texts]} if texts is not None else {}}
        return self.redactor.redact(document, decision.logging.redact)

    def write_after_engine(self, backend, request_id: str, record: dict) -> asyncio.Future | None:
        """Writes the record with the engine's x-record for the request: at once when the engine has
        it (or keeps none), else once it is in (or a moment has passed).
        backend: whatever ran the request (None: nothing did), with engine_record() and expects_records.
        Returns None when the record is written (or, for a refusal, refused: no acknowledgement waits
        on it); else a future for a caller that must wait, which raises AuditUnavailable when the trail
        could not keep the record."""
        if backend is None:  # nothing ran: a refusal, which is no acknowledgement, record or not
            try:
                self.write(record)
            except AuditUnavailable:
                pass  # the trail logged it
            return None
        engine_record = backend.engine_record(request_id)
        if engine_record is not None or not backend.expects_records:
            # Nothing to wait for: written now, without a task and two turns of the event loop.
            try:
                self._write_with(record, engine_record)
            except AuditUnavailable as exc:
                refused = asyncio.get_running_loop().create_future()
                refused.set_exception(exc)
                refused.exception()  # raised to a caller who awaits it; no warning when none does
                return refused
            return None

        async def join() -> None:
            deadline = time.monotonic() + ENGINE_RECORD_WAIT_S
            engine_record = None
            while engine_record is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
                engine_record = backend.engine_record(request_id)
            self._write_with(record, engine_record)

        task = asyncio.get_running_loop().create_task(join())
        self.pending.add(task)
        task.add_done_callback(self._settled)
        return task

    def _write_with(self, record: dict, engine_record) -> None:
        if engine_record is not None:
            record["engine"] = {k: v for k, v in dataclasses.asdict(engine_record).items() if k != "request_id"}
        self.write(record)

    def _settled(self, task: asyncio.Task) -> None:
        self.pending.discard(task)
        if not task.cancelled():
            task.exception()  # a refusal nobody awaits (the request ended in an error) is no unhandled error

    async def drain(self) -> None:
        if self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)

    def close(self) -> None:
        if self.trail is not None:
            self.trail.close()
