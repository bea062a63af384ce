"""The derivation outbox in the admin: what waits, what failed and why, and a way
to try parked notes again once the cause is fixed. Read-only otherwise: notes are
written by ingest and removed by the drainer. Beside it, the batches ingest refused
because the database failed them for good (500: lost, the senders do not retry),
counted per project, transport and day; their errors are in the server log."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from dashboard.accounts.admin import ProjectScopedAdmin

from .derive.notes import notes_retry
from .models import DerivationNote, IngestDatabaseFault


@admin.register(DerivationNote)
class DerivationNoteAdmin(ProjectScopedAdmin):
    list_display = ("id", "project", "created_at", "attempts", "parked", "available_at", "short_error")
    list_filter = ProjectScopedAdmin.list_filter + ["parked"]
    readonly_fields = [field.name for field in DerivationNote._meta.fields]
    actions = ["retry_now"]

    @admin.display(description="last error")
    def short_error(self, note: DerivationNote) -> str:
        return note.last_error[:120]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: DerivationNote | None = None) -> bool:
        return False

    @admin.action(description="Retry now")
    def retry_now(self, request: HttpRequest, queryset: QuerySet) -> None:
        count = notes_retry(ids=queryset.values_list("id", flat=True))
        self.message_user(request, f"{count} note(s) will be derived again shortly.", messages.SUCCESS)


@admin.register(IngestDatabaseFault)
class IngestDatabaseFaultAdmin(ProjectScopedAdmin):
    list_display = ("day", "project", "transport", "count", "last_at", "last_error")
    list_filter = ProjectScopedAdmin.list_filter + ["transport", "day"]
    ordering = ("-day", "-last_at")
    readonly_fields = [field.name for field in IngestDatabaseFault._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: IngestDatabaseFault | None = None) -> bool:
        return False
