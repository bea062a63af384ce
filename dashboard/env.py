"""Settings read from the environment.

Each helper parses one variable and raises ImproperlyConfigured naming it when the
value is bad, so a typo stops the process at start instead of becoming a 500 later.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false, yes/no), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_dir(name: str, default: str) -> Path:
    """A directory, created when missing (the data dir holds the database and artifacts)."""
    path = Path(os.environ.get(name) or default).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ImproperlyConfigured(f"{name}: cannot create directory {path}: {exc.strerror}") from None
    return path


def secret_key(data_dir: Path, *, debug: bool, testing: bool = False) -> str:
    """SECRET_KEY from the environment; in DEBUG a generated one kept in the data dir,
    so sessions survive restarts without anyone having to invent a key; under a test
    runner a throwaway one (nothing signed in a test outlives the run)."""
    value = os.environ.get("SECRET_KEY", "")
    if value:
        if len(value) < 32:
            raise ImproperlyConfigured("SECRET_KEY must be at least 32 characters")
        return value
    if testing:
        return secrets.token_urlsafe(50)
    if not debug:
        raise ImproperlyConfigured("SECRET_KEY is required when DEBUG is off")
    key_file = data_dir / "secret_key"
    if key_file.exists():
        return key_file.read_text().strip()
    value = secrets.token_urlsafe(50)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value)
    return value


def running_tests() -> bool:
    """True under pytest or ``manage.py test``: only then may SECRET_KEY be missing
    with DEBUG off."""
    return "pytest" in sys.modules or sys.argv[1:2] == ["test"]


SQLITE_SYNCHRONOUS_CHOICES = ("FULL", "NORMAL", "EXTRA")
SQLITE_BUSY_TIMEOUT_MS = 5000  # how long a writer waits for its turn before "database is locked"


def sqlite_synchronous(name: str = "SQLITE_SYNCHRONOUS") -> str:
    raw = os.environ.get(name, "FULL").strip().upper() or "FULL"
    if raw not in SQLITE_SYNCHRONOUS_CHOICES:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(SQLITE_SYNCHRONOUS_CHOICES)}, got {raw!r}")
    return raw


OTLP_HTTP_SERVERS = ("granian", "uvicorn")


def otlp_http_server(name: str = "OBSERVATORY_OTLP_HTTP_SERVER") -> str:
    """The HTTP server of ``manage.py otlp_http``: Granian unless told otherwise."""
    raw = os.environ.get(name, "granian").strip().lower() or "granian"
    if raw not in OTLP_HTTP_SERVERS:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(OTLP_HTTP_SERVERS)}, got {raw!r}")
    return raw


def database(name: str, data_dir: Path) -> dict[str, Any]:
    """DATABASES["default"] from a URL; unset means SQLite in the data dir.

    SQLite (Django's own backend) runs in WAL mode with IMMEDIATE transactions so
    concurrent writers wait in SQLite's busy handler for up to the busy timeout
    instead of failing on a lock upgrade. ``SQLITE_SYNCHRONOUS``
    picks durability: FULL (the default) syncs the WAL at every commit, so an
    acknowledged batch survives a power cut; NORMAL syncs only at checkpoints (an
    acknowledged commit can be lost on power failure, never on a process crash).
    """
    url = os.environ.get(name, "").strip()
    if not url:
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": data_dir / "observatory.sqlite3",
            "OPTIONS": {
                "init_command": (
                    f"PRAGMA journal_mode=WAL; PRAGMA synchronous={sqlite_synchronous()}; PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}"
                ),
                "transaction_mode": "IMMEDIATE",
            },
            # Kept open per worker thread like PostgreSQL's: opening a SQLite
            # connection (and closing the last one, which checkpoints the WAL) cost
            # about 2 ms, more than storing a small batch.
            "CONN_MAX_AGE": env_int("DATABASE_CONN_MAX_AGE", 60),
            "CONN_HEALTH_CHECKS": True,
            # Tests get a file too, not Django's shared in-memory database: a live
            # server's threads then each have their own connection, as in production
            # (on one shared connection one request's rollback undid another's commit).
            "TEST": {"NAME": str(data_dir / "test-observatory.sqlite3")},
        }
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ImproperlyConfigured(
            f"{name} must be a postgres:// or postgresql:// URL (or unset for SQLite), "
            f"got scheme {parts.scheme!r}"
        )
    db_name = unquote(parts.path.lstrip("/"))
    if not db_name:
        raise ImproperlyConfigured(f"{name} has no database name")
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"{name} has an invalid port") from None
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": db_name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(port or ""),
        "CONN_MAX_AGE": env_int("DATABASE_CONN_MAX_AGE", 60),
        "CONN_HEALTH_CHECKS": True,
    }
