"""Policy decisions: the Rego decision contract, its schema, and the engines that evaluate it."""

from gateway.policy.evaluator import EmbeddedEvaluator
from gateway.policy.exceptions import (
    DecisionSchemaError,
    PolicyError,
    PolicyEvaluationError,
    PolicySyntaxError,
)
from gateway.policy.schema import Decision, ToolsDecision

__all__ = [
    "Decision",
    "DecisionSchemaError",
    "EmbeddedEvaluator",
    "PolicyError",
    "PolicyEvaluationError",
    "PolicySyntaxError",
    "ToolsDecision",
]
