"""The project switcher: the user's projects and the one in the URL."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject


def projects(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}

    def load() -> list[Any]:
        from dashboard.accounts.selectors import projects_for_user

        return list(projects_for_user(user).only("id", "name", "slug"))

    # Lazy: an htmx partial that never shows the switcher costs no query.
    return {
        "user_projects": SimpleLazyObject(load),
        "current_project": getattr(request, "project", None),
    }
