"""Redaction: what may be written about a request when its tenant allows `redacted` content.

By default nothing of the content is written, only digests and counts. In `redacted`
mode the decision's JSON pointers are removed (`remove_pointers`) and the detectors
replace secrets and personal data with typed, keyed placeholders (`Redactor`), reading the
text in one spelling (`fold`) so fullwidth digits or look-alike letters hide nothing.
"""

from gateway.redaction.detectors import DETECTORS
from gateway.redaction.exceptions import InvalidPointerError, RedactionError
from gateway.redaction.folding import fold
from gateway.redaction.matching import Detector
from gateway.redaction.pointers import remove_pointers
from gateway.redaction.redactor import Finding, Redactor

__all__ = [
    "DETECTORS",
    "Detector",
    "Finding",
    "InvalidPointerError",
    "RedactionError",
    "Redactor",
    "fold",
    "remove_pointers",
]
