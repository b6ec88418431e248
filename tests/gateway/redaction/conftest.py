import pytest

from gateway.redaction import Redactor

KEY = b"redaction-test-key-0123456789abcdef"


@pytest.fixture(scope="session")
def redactor() -> Redactor:
    return Redactor(KEY)
