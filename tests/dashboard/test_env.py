"""Settings from the environment: a bad value stops the process with the variable's name."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from dashboard import env


@pytest.mark.parametrize(
    "name, value, call",
    [("DEBUG", "maybe", lambda: env.env_bool("DEBUG")),
     ("OBSERVATORY_MAX_BODY_BYTES", "8MB", lambda: env.env_int("OBSERVATORY_MAX_BODY_BYTES", 1)),
     ("OBSERVATORY_MAX_BODY_BYTES", "-1", lambda: env.env_int("OBSERVATORY_MAX_BODY_BYTES", 1))],
)
def test_it_names_the_variable_of_a_bad_value(monkeypatch, name, value, call):
    monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=name):
        call()


def test_it_uses_sqlite_with_wal_in_the_data_dir_when_no_url(monkeypatch, tmp_path):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    config = env.database("DATABASE_URL", tmp_path)
    assert config["ENGINE"].endswith("sqlite3") and config["NAME"] == tmp_path / "observatory.sqlite3"
    assert "journal_mode=WAL" in config["OPTIONS"]["init_command"]
    assert config["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


def test_it_reads_a_postgres_url(monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", "postgresql://obs:p%40ss@db.internal:6543/observatory")
    config = env.database("DATABASE_URL", tmp_path)
    assert (config["ENGINE"], config["NAME"], config["USER"], config["PASSWORD"], config["HOST"], config["PORT"]) == (
        "django.db.backends.postgresql", "observatory", "obs", "p@ss", "db.internal", "6543")
    assert config["CONN_MAX_AGE"] > 0


@pytest.mark.parametrize("url", ["mysql://x/y", "sqlite:///tmp/x", "postgres://host:notaport/db", "postgres://host/"])
def test_it_refuses_other_database_urls(monkeypatch, tmp_path, url):
    monkeypatch.setenv("DATABASE_URL", url)
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        env.database("DATABASE_URL", tmp_path)


def test_it_requires_a_secret_key_without_debug_and_persists_one_with_debug(monkeypatch, tmp_path):
    monkeypatch.delenv("SECRET_KEY", raising=False)
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY"):
        env.secret_key(tmp_path, debug=False)
    first = env.secret_key(tmp_path, debug=True)
    assert env.secret_key(tmp_path, debug=True) == first
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0
    monkeypatch.setenv("SECRET_KEY", "short")
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY"):
        env.secret_key(tmp_path, debug=False)


def test_it_creates_the_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("OBSERVATORY_DATA_DIR", str(tmp_path / "a" / "b"))
    assert env.env_dir("OBSERVATORY_DATA_DIR", "./var").is_dir()
