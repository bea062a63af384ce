"""Writes of the pages' own data: saved views."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.http import QueryDict

from dashboard.accounts.models import Project

from .models import SavedView

# Paging cursors are not part of a view: it opens on its first page.
NOT_SAVED = ("after", "before", "page")


class SavedViewError(ValueError):
    """A view that cannot be saved (the message says why)."""


def saved_view_query(query: QueryDict) -> str:
    """The list's query string without its paging cursors, keys in a stable order."""
    kept = QueryDict(mutable=True)
    for key in sorted(query):
        if key not in NOT_SAVED:
            kept.setlist(key, [value for value in query.getlist(key) if value != ""])
    return kept.urlencode()


def saved_view_create(*, project: Project, owner: Any, page: str, name: str, query: str,
                      shared: bool) -> SavedView:
    try:
        with transaction.atomic():
            return SavedView.objects.create(project=project, owner=owner, page=page, name=name,
                                            query=query, shared=shared)
    except IntegrityError:
        raise SavedViewError(f"You already have a view named {name!r} here.") from None


def saved_view_delete(*, view: SavedView, user: Any) -> None:
    if view.owner_id != user.pk:
        raise SavedViewError("Only its owner can delete a view.")
    view.delete()
