"""Admin for the project's score configs (what a score of a name may be), and a
read-only look at scores with their edit history, and at the OpenTelemetry
evaluations ingest refused. Scores are made through the API,
the pages and OpenTelemetry; the admin only shows them (and may delete)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone

from dashboard.accounts.admin import ProjectScopedAdmin

from .models import EvaluationRefusal, Score, ScoreConfig, ScoreEdit


@admin.register(ScoreConfig)
class ScoreConfigAdmin(ProjectScopedAdmin):
    list_display = ["name", "project", "kind", "min_value", "max_value", "labels", "updated_at"]
    search_fields = ["name", "description"]
    fields = ["project", "name", "kind", "min_value", "max_value", "labels", "negative_labels", "description"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        obj.updated_at = timezone.now()
        super().save_model(request, obj, form, change)


class ScoreEditInline(admin.TabularInline):
    model = ScoreEdit
    extra = 0
    fields = readonly_fields = ["changed_at", "by_name", "source", "changes"]
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Score)
class ScoreAdmin(ProjectScopedAdmin):
    list_display = ["name", "shown_value", "target", "source", "author_name", "occurred_at", "project"]
    list_filter = [("project", admin.RelatedOnlyFieldListFilter), "source", "target", "negative"]
    search_fields = ["name", "score_id", "conversation_key", "trace_id"]
    readonly_fields = [field.name for field in Score._meta.fields]
    fields = readonly_fields
    inlines = [ScoreEditInline]
    show_full_result_count = False  # counting a million scores for the header is not worth it

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(EvaluationRefusal)
class EvaluationRefusalAdmin(ProjectScopedAdmin):
    """The gen_ai.evaluation.result events ingest refused, per score name (read only)."""

    list_display = ["name", "project", "count", "last_reason", "first_at", "last_at"]
    search_fields = ["name", "last_reason"]
    readonly_fields = fields = ["project", "name", "count", "last_reason", "first_at", "last_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
