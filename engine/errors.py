"""Every exception the engine raises to its callers, in one place (`from engine import RequestError`).

The messages are safe to show to the caller unless a class says otherwise. Errors that never leave
the engine stay with their modules: `AllocatorError` (a broken block-manager invariant) and
`GrammarError` (the engine answers it as a RequestError). The replica server's `EnvelopeRejected`
belongs to `engine.remote`.
"""

from __future__ import annotations


class RequestError(ValueError):
    """A request the engine refuses; the message is safe to show to the caller."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code  # OpenAI's error code where one fits (context_length_exceeded)

    def caller_message(self, field: str | None = None) -> str:
        """The message as the caller reads it. A schema's refusal (param response_format) is its
        reason alone, read after the field the schema came from: `field` (tools, text.format),
        else response_format."""
        if self.param == "response_format":
            return f"{field or self.param}: {self}"
        return str(self)


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (an internal error or shutdown); requests cannot be served."""


class SamplingParamsError(ValueError):
    """A decode setting outside its valid range; the message names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


class EnvelopeError(ValueError):
    """An envelope field is missing or out of range."""


class TokenizerError(ValueError):
    pass


class ConfigError(ValueError):
    """A configuration value or checkpoint config.json that the engine cannot run."""


class ModelNotFoundError(FileNotFoundError):
    pass


class WeightsError(ValueError):
    """A checkpoint's weight files are missing, corrupt or do not match the config."""


class GGUFError(ValueError):
    """A GGUF file that cannot be read or holds something the engine does not run; the message names it."""


class EncoderError(ValueError):
    """An encoder checkpoint is missing, unreadable or not a BERT model we can run."""
