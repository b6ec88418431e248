"""Policy errors. Every one of them denies the request; none carries request content."""


class PolicyError(Exception):
    """Base class: the policy could not produce a valid decision, so the request is denied."""


class PolicySyntaxError(PolicyError):
    """A Rego file does not parse (or refers to something that does not exist)."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


class PolicyEvaluationError(PolicyError):
    """Evaluation failed, or the entrypoint produced no decision."""


class DecisionSchemaError(PolicyError):
    """The decision document is missing a field, has an unknown one, or a value out of range."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class BundleError(PolicyError):
    """A bundle could not be built or signed."""
