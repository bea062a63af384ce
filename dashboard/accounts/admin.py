"""Admin for projects, members and keys. Keys are created with the createapikey
command (the text is shown once there); the admin can revoke them."""

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from .models import ApiKey, Membership, Project
from .services import apikey_revoke


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["project", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["project"]
    search_fields = ["prefix", "name"]
    readonly_fields = ["project", "prefix", "hash", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # the key text can only be shown once: use `manage.py createapikey`

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset:
            apikey_revoke(key=key)
        self.message_user(request, f"Revoked {queryset.count()} key(s).", messages.SUCCESS)
