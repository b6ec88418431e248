"""`tenantgate cache audit`: does a deployment's prefix cache cross namespaces? A timing audit in
the style of Gu et al. (ICML 2025), reusable by benchmarks and tests:

    result = await run_audit(send, token_prefixes(64, vocab_size), budget=AuditBudget(trials=20))
    result.verdict, result.cross.p_value, result.control.p_value

docs/cache-audit.md has the method, the verdicts and the figures measured.
"""

from gateway.cache.audit import (
    ATTACKER,
    DEFAULT_ALPHA,
    REQUESTS_PER_TRIAL,
    VICTIM,
    AuditBudget,
    AuditResult,
    Comparison,
    Verdict,
    audit,
    run_audit,
    verdict_of,
)
from gateway.cache.stats import KSResult, ks_2samp
from gateway.cache.targets import (
    AuditTargetError,
    OpenAITarget,
    TokenTarget,
    audit_envelopes,
    text_prefixes,
    token_prefixes,
)

__all__ = [
    "ATTACKER",
    "DEFAULT_ALPHA",
    "REQUESTS_PER_TRIAL",
    "VICTIM",
    "AuditBudget",
    "AuditResult",
    "AuditTargetError",
    "Comparison",
    "KSResult",
    "OpenAITarget",
    "TokenTarget",
    "Verdict",
    "audit",
    "audit_envelopes",
    "ks_2samp",
    "run_audit",
    "text_prefixes",
    "token_prefixes",
    "verdict_of",
]
