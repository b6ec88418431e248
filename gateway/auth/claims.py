"""The sign-in claims of a verified token that Conditional Access decisions read: which
authentication contexts it satisfied (`acrs`), how the user signed in (`amr`), when
(`auth_time`), in which session (`sid`), what the client can handle (`xms_cc`), and the device.

Each is checked for type and size. A claim of an unknown shape is dropped, never trusted and
never a reason to refuse the token: a requirement that needs it then fails, which is fail
closed, while a token that needs nothing of it keeps working when Entra adds a value we do not
know. Values are never logged; a dropped claim is logged by name.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger("tenantgate.auth")

_MAX_ITEMS = 16
_MAX_DATE = 10**13  # as entra._MAX_DATE: far beyond any real date, small enough to stay exact
_AUTH_CONTEXT = re.compile(r"c([1-9]|[1-9][0-9])")  # Entra's authentication context ids c1..c99
_AMR = re.compile(r"[a-z0-9_]{1,32}")
_CAPABILITY = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SESSION = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_UTI = re.compile(r"[A-Za-z0-9_-]{1,64}")
_GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
# The capability a client declares when it can answer a claims challenge (MSAL's client_capabilities).
CLAIMS_CHALLENGE_CAPABILITY = "cp1"


@dataclass(frozen=True, slots=True)
class SessionClaims:
    acrs: tuple[str, ...] = ()
    amr: tuple[str, ...] = ()
    xms_cc: tuple[str, ...] = ()
    sid: str | None = None
    uti: str | None = None
    auth_time: int | None = None
    iat: int | None = None
    device_id: str | None = None

    @property
    def takes_claims_challenge(self) -> bool:
        """Whether the client declared it can follow a claims challenge (Entra sends none otherwise)."""
        return CLAIMS_CHALLENGE_CAPABILITY in self.xms_cc

    def policy_input(self) -> dict:
        """The members of the input's `principal` object that come from these claims: the lists
        always (empty when absent), the single values only when the token carries them."""
        document: dict = {"acrs": list(self.acrs), "amr": list(self.amr), "xms_cc": list(self.xms_cc)}
        optional = {"sid": self.sid, "uti": self.uti, "auth_time": self.auth_time, "iat": self.iat,
                    "deviceid": self.device_id}
        document.update({name: value for name, value in optional.items() if value is not None})
        return document


NO_SESSION_CLAIMS = SessionClaims()


def session_claims(claims: dict) -> SessionClaims:
    """The session claims of a token whose signature, issuer and lifetime are already checked."""
    return SessionClaims(
        acrs=_names(claims, "acrs", _AUTH_CONTEXT),
        amr=_names(claims, "amr", _AMR),
        xms_cc=_names(claims, "xms_cc", _CAPABILITY),
        sid=_string(claims, "sid", _SESSION),
        uti=_string(claims, "uti", _UTI),
        auth_time=_date(claims, "auth_time"),
        iat=_date(claims, "iat"),
        device_id=_device_id(claims),
    )


def _ignored(name: str) -> None:
    log.info("token claim ignored: name=%s (not of the expected shape)", name)


def _names(claims: dict, name: str, pattern: re.Pattern[str]) -> tuple[str, ...]:
    """A list of short strings of one pattern, duplicates dropped, in the token's order."""
    if name not in claims:
        return ()
    value = claims[name]
    if (not isinstance(value, list) or len(value) > _MAX_ITEMS
            or not all(isinstance(item, str) and pattern.fullmatch(item) for item in value)):
        _ignored(name)
        return ()
    return tuple(dict.fromkeys(value))


def _string(claims: dict, name: str, pattern: re.Pattern[str]) -> str | None:
    if name not in claims:
        return None
    value = claims[name]
    if not isinstance(value, str) or not pattern.fullmatch(value):
        _ignored(name)
        return None
    return value


def _date(claims: dict, name: str) -> int | None:
    """A NumericDate in whole seconds."""
    if name not in claims:
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < _MAX_DATE:
        _ignored(name)
        return None
    return int(value)


def _device_id(claims: dict) -> str | None:
    value = _string(claims, "deviceid", _GUID)
    return value.lower() if value is not None else None
