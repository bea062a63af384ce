"""Admin for projects, members and keys, and the project scoping every admin of
project-owned rows uses: a staff user who is not a superuser sees and picks only the
projects they belong to. Stored conversation data has no admin: the pages are its UI
(and they never show a storage path).

Keys are created on the project's keys page or with ``manage.py createapikey`` (the text
is shown once there); the admin can revoke them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from .models import ApiKey, Membership, Project
from .selectors import projects_for_user
from .services import apikey_revoke


class ProjectScopedAdmin(admin.ModelAdmin):
    """Rows and project choices limited to the user's projects (superusers see all)."""

    list_filter: Any = [("project", admin.RelatedOnlyFieldListFilter)]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request).select_related("project")
        if request.user.is_superuser:
            return qs
        return qs.filter(project__in=projects_for_user(request.user))

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "project" and not request.user.is_superuser:
            kwargs["queryset"] = projects_for_user(request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Picking users lists every account name: only superusers manage members.
        return request.user.is_superuser

    has_add_permission = has_delete_permission = has_change_permission  # type: ignore[assignment]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Project]:
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(pk__in=projects_for_user(request.user).values("pk"))


@admin.register(ApiKey)
class ApiKeyAdmin(ProjectScopedAdmin):
    list_display = ["project", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    search_fields = ["prefix", "name"]
    fields = readonly_fields = ["project", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # the key text can only be shown once: use the keys page or `manage.py createapikey`

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = 0
        for key in queryset:
            apikey_revoke(key=key)
            count += 1
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)
