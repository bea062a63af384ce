"""Saved views: a named filter set of a list page, kept per user, optionally
shared with the project's members. Only the query string is stored; opening the
view is following ``<list URL>?<query>``, so a link reproduces it too."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from dashboard.accounts.models import Project

# The list pages a view can be saved on: key -> URL name.
SAVED_VIEW_PAGES = {"conversations": "web:conversations", "traces": "web:traces"}


class SavedView(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="saved_views")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views")
    page = models.CharField(max_length=32, default="conversations")
    name = models.CharField(max_length=100)
    query = models.CharField(max_length=2000, blank=True)  # the list's query string, normalised
    shared = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "owner", "page", "name"], name="saved_view_name_unique"),
        ]
        indexes = [
            # the nav's list: the user's own views and the project's shared ones
            models.Index(fields=["project", "owner"], name="saved_view_owner"),
            models.Index(fields=["project", "shared"], name="saved_view_shared", condition=models.Q(shared=True)),
        ]

    def __str__(self) -> str:
        return self.name
