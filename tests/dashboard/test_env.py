"""Settings from the environment: a bad value stops the process with the variable's name."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from dashboard import env


@pytest.mark.parametrize(
    "name, value, call",
    [("DEBUG", "maybe", lambda: env.env_bool("DEBUG")),
     ("OBSERVATORY_MAX_BODY_BYTES", "8MB", lambda: env.env_int("OBSERVATORY_MAX_BODY_BYTES", 1)),
     ("OBSERVATORY_MAX_BODY_BYTES", "-1", lambda: env.env_int("OBSERVATORY_MAX_BODY_BYTES", 1)),
     ("SQLITE_SYNCHRONOUS", "OFF", lambda: env.sqlite_synchronous()),
     ("OBSERVATORY_OTLP_HTTP_SERVER", "builtin", lambda: env.otlp_http_server())],
)
def test_it_names_the_variable_of_a_bad_value(monkeypatch, name, value, call):
    monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=name):
        call()


def test_it_uses_sqlite_with_wal_in_the_data_dir_when_no_url(monkeypatch, tmp_path):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    config = env.database("DATABASE_URL", tmp_path)
    assert config["ENGINE"] == "django.db.backends.sqlite3" and config["NAME"] == tmp_path / "observatory.sqlite3"
    assert "journal_mode=WAL" in config["OPTIONS"]["init_command"]
    assert config["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "synchronous=FULL" in config["OPTIONS"]["init_command"]  # durable by default


def test_it_lets_sqlite_trade_durability_for_speed(monkeypatch, tmp_path):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("SQLITE_SYNCHRONOUS", "normal")
    assert "synchronous=NORMAL" in env.database("DATABASE_URL", tmp_path)["OPTIONS"]["init_command"]


def test_it_applies_the_synchronous_choice_to_the_connection(transactional_db):
    # Outside a transaction: inside one it is NORMAL and the commit syncs after the
    # lock (test_sqlite_writers.py).
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("SQLite only")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous")
        assert cursor.fetchone()[0] == 2  # FULL


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


def _settings_in_subprocess(tmp_path, extra_env, names):
    import os
    import subprocess
    import sys

    code = (
        "import json, django; django.setup(); from django.conf import settings; "
        f"print(json.dumps({{n: getattr(settings, n, None) for n in {names!r}}}))"
    )
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "dashboard.settings", "SECRET_KEY": "x" * 40,
                   "OBSERVATORY_DATA_DIR": str(tmp_path), **extra_env}
    environment.pop("DATABASE_URL", None)
    result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=60)
    return result


def test_it_reads_https_settings_from_the_environment(tmp_path):
    names = ["SECURE_HSTS_SECONDS", "SECURE_SSL_REDIRECT", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_PROXY_SSL_HEADER"]
    off = _settings_in_subprocess(tmp_path, {}, names)
    assert off.returncode == 0, off.stderr
    assert '"SECURE_HSTS_SECONDS": 0' in off.stdout and '"SECURE_SSL_REDIRECT": false' in off.stdout
    on = _settings_in_subprocess(tmp_path, {"SECURE_HSTS_SECONDS": "31536000", "SECURE_SSL_REDIRECT": "1",
                                            "SECURE_HSTS_INCLUDE_SUBDOMAINS": "yes", "SECURE_PROXY_SSL_HEADER": "1"},
                                 names)
    assert on.returncode == 0, on.stderr
    assert '"SECURE_HSTS_SECONDS": 31536000' in on.stdout and '"SECURE_SSL_REDIRECT": true' in on.stdout
    assert '"SECURE_HSTS_INCLUDE_SUBDOMAINS": true' in on.stdout
    assert '["HTTP_X_FORWARDED_PROTO", "https"]' in on.stdout


def test_it_stops_at_start_on_a_bad_https_setting(tmp_path):
    result = _settings_in_subprocess(tmp_path, {"SECURE_HSTS_SECONDS": "a year"}, ["SECURE_HSTS_SECONDS"])
    assert result.returncode != 0 and "SECURE_HSTS_SECONDS" in result.stderr
