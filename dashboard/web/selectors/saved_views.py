"""Saved views a user may open: their own and those shared in the project."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet
from django.shortcuts import get_object_or_404

from dashboard.accounts.models import Project

from ..models import SavedView

NAV_LIMIT = 50


def visible_views(user: Any, project: Project) -> QuerySet[SavedView]:
    return SavedView.objects.filter(project=project).filter(Q(owner=user) | Q(shared=True))


def saved_views_for(user: Any, project: Project, *, page: str) -> list[SavedView]:
    return list(visible_views(user, project).filter(page=page).select_related("owner")[:NAV_LIMIT])


def saved_view_for(user: Any, project: Project, pk: int) -> SavedView:
    """404 for another project's view and for someone else's unshared one."""
    return get_object_or_404(visible_views(user, project), pk=pk)
