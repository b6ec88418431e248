"""One cache directory for everything tenantgate builds once: models, the dev issuer's key, the audit key."""

from __future__ import annotations

from pathlib import Path

from devkit.issuer import dev_issuer_key_dir
from engine.paths import CACHE_DIR_ENV, default_cache_dir


def test_the_cache_dir_is_the_variable_else_the_users_cache(monkeypatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, "~/tenantgate-elsewhere")
    assert default_cache_dir() == Path.home() / "tenantgate-elsewhere"
    monkeypatch.setenv(CACHE_DIR_ENV, "")
    assert default_cache_dir() == Path.home() / ".cache" / "tenantgate"
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert default_cache_dir() == Path.home() / ".cache" / "tenantgate"


def test_the_dev_issuer_keeps_its_key_in_the_engines_cache_dir(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    assert dev_issuer_key_dir() == default_cache_dir() / "dev-issuer" == tmp_path / "dev-issuer"
