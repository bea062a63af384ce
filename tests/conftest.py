"""Shared pytest-django fixtures: users, projects, API keys, and an artifacts storage
in a temporary directory. Runs on SQLite by default and on PostgreSQL when
DATABASE_URL is set (the settings read it)."""

from __future__ import annotations

from typing import Any

import pytest

PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _test_settings(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Artifacts written by a test land in its own temporary directory; passwords
    hash fast."""
    if "settings" not in request.fixturenames and not _uses_django(request):
        yield None
        return
    settings = request.getfixturevalue("settings")
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast user fixtures
    location = tmp_path_factory.mktemp("artifacts")
    settings.STORAGES = {
        **settings.STORAGES,
        "artifacts": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(location), "base_url": None},
        },
    }
    yield location


def _uses_django(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("django_db") is not None or any(
        name in request.fixturenames for name in ("db", "transactional_db", "client", "live_server")
    )


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("ana", password=PASSWORD)


@pytest.fixture
def other_user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("bo", password=PASSWORD)


@pytest.fixture
def project(user: Any) -> Any:
    from dashboard.accounts.services import project_create

    return project_create(name="Agents", owner=user)


@pytest.fixture
def other_project(other_user: Any) -> Any:
    from dashboard.accounts.services import project_create

    return project_create(name="Elsewhere", owner=other_user)


@pytest.fixture
def api_key(project: Any) -> str:
    from dashboard.accounts.services import apikey_create

    return apikey_create(project=project, name="test")[1]


@pytest.fixture
def other_api_key(other_project: Any) -> str:
    from dashboard.accounts.services import apikey_create

    return apikey_create(project=other_project, name="test")[1]


@pytest.fixture
def auth(api_key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {api_key}"}


@pytest.fixture
def other_auth(other_api_key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {other_api_key}"}


@pytest.fixture
def member_client(client: Any, user: Any) -> Any:
    client.force_login(user)
    return client


class RecordFactory:
    """Pipeline records as the JSON an agent sends (dicts), with sensible defaults."""

    def __init__(self) -> None:
        import datetime as dt

        self.now = dt.datetime.now(dt.timezone.utc).replace(minute=30, second=0, microsecond=0) - dt.timedelta(hours=1)
        self._n = 0

    def _base(self, kind: str, conversation: str, at: Any, extra: dict[str, Any]) -> dict[str, Any]:
        import uuid

        self._n += 1
        return {
            "type": kind,
            "record_id": str(uuid.uuid4()),
            "conversation_id": conversation,
            "occurred_at": (at or self.now).isoformat(),
            **extra,
        }

    def round(self, conversation: str = "conv-1", index: int = 0, at: Any = None, **extra: Any) -> dict[str, Any]:
        return self._base("round", conversation, at, {"round_id": f"r{index}", "index": index, **extra})

    def message(self, conversation: str = "conv-1", index: int = 0, role: str = "user", content: str = "hello",
                at: Any = None, **extra: Any) -> dict[str, Any]:
        return self._base("message", conversation, at, {"index": index, "role": role, "content": content, **extra})

    def tool_result(self, conversation: str = "conv-1", tool: str = "query_sales", success: bool = True,
                    duration_ms: float = 12.0, at: Any = None, result: dict[str, Any] | None = None,
                    **extra: Any) -> dict[str, Any]:
        body = {
            "tool_call_id": f"call_{self._n}",
            "observation": "3 rows",
            "success": success,
            "duration_ms": duration_ms,
            **({} if success else {"error_type": "timeout", "error_message": "took too long"}),
            **(result or {}),
        }
        return self._base("tool_result", conversation, at, {"tool_name": tool, "result": body, **extra})

    def compression(self, conversation: str = "conv-1", at: Any = None, **extra: Any) -> dict[str, Any]:
        result = {
            "mode": "extract", "target_tokens": 100, "tokens_before": 400, "tokens_after": 90,
            "messages_before": 3, "messages_after": 2, "target_met": True,
            "changes": [
                {"index": 0, "role": "system", "priority": "critical", "action": "kept",
                 "tokens_before": 10, "tokens_after": 10},
                {"index": 1, "role": "tool", "priority": "low", "action": "dropped",
                 "tokens_before": 300, "tokens_after": 0},
                {"index": 2, "role": "user", "priority": "high", "action": "kept",
                 "tokens_before": 80, "tokens_after": 80},
            ],
        }
        return self._base("compression", conversation, at, {"result": result, **extra})

    def skill(self, conversation: str = "conv-1", at: Any = None, **extra: Any) -> dict[str, Any]:
        return self._base("skill_activation", conversation, at,
                          {"skill_name": "sales-report", "activation_id": "act-1", "load_level": 2, **extra})


@pytest.fixture
def records() -> RecordFactory:
    return RecordFactory()
