"""Admin for the tuning models.

Every save or delete bumps the project's config revision (what ``GET /api/v1/config``
serves is built from these rows); validation is the pipeline's own (model
``clean``). A staff user who is not a superuser sees and picks only the projects
they belong to. The compression profile form has a Preview button that runs the
pipeline's compression with the edited config on a stored conversation and shows
the diff without saving anything.
"""

from __future__ import annotations

from typing import Any, Optional

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse

from dashboard.accounts.admin import ProjectScopedAdmin
from dashboard.accounts.selectors import projects_for_user
from dashboard.observatory.models import Conversation
from dashboard.web.selectors.compressions import compression_diff
from pipeline import ContextCompressionConfig

from .models import CompressionProfile, EncoderRule, PriceRule, RetentionPolicy, ToolOutputPolicy
from .preview import compression_preview
from .services import compression_profile_activate, config_revision_bump, prices_changed


PREVIEW_CANDIDATES = 200  # the latest conversations the preview's suggestions are picked from
PREVIEW_SUGGESTIONS = 20


class _ConfigAdmin(ProjectScopedAdmin):
    """A change here changes what agents fetch: count it in the config revision."""

    readonly_fields = ["updated_at"]  # set by the model's save

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        config_revision_bump(project=obj.project)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        project = obj.project
        super().delete_model(request, obj)
        config_revision_bump(project=project)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        projects = {obj.project for obj in queryset}
        super().delete_queryset(request, queryset)
        for project in projects:
            config_revision_bump(project=project)


class CompressionProfileForm(forms.ModelForm):
    """Marking a profile active deactivates the project's other one on save,
    instead of failing the one-active constraint."""

    class Meta:
        model = CompressionProfile
        fields = ["project", "name", "config", "is_active"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["config"].required = False  # {} is valid: every field at its default

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        self.wants_active = bool(data.get("is_active"))
        data["is_active"] = False  # set again by compression_profile_activate after the save
        if not isinstance(data.get("config"), dict):
            self.add_error("config", "The config must be a JSON object.")
        return data


class PreviewForm(forms.Form):
    """What the Preview button needs beyond the profile itself."""

    preview_conversation = forms.CharField(
        label="Conversation", max_length=200,
        help_text="the agent's conversation id, or the dashboard's conversation number",
    )
    preview_target_tokens = forms.IntegerField(
        label="Target tokens", required=False, min_value=1, max_value=10_000_000,
        help_text="empty: the config's max_tokens × target_ratio",
    )


@admin.register(CompressionProfile)
class CompressionProfileAdmin(_ConfigAdmin):
    form = CompressionProfileForm
    list_display = ["name", "project", "is_active", "updated_at"]
    actions = ["activate"]
    change_form_template = "admin/tuning/compressionprofile/change_form.html"

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        initial = super().get_changeform_initial_data(request)
        initial.setdefault("config", ContextCompressionConfig().to_dict())
        return initial

    def save_model(self, request: HttpRequest, obj: CompressionProfile, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if getattr(form, "wants_active", False):
            compression_profile_activate(profile=obj)

    @admin.action(description="Make the selected profile the active one")
    def activate(self, request: HttpRequest, queryset: QuerySet[CompressionProfile]) -> None:
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one profile.", messages.ERROR)
            return
        compression_profile_activate(profile=queryset.get())
        self.message_user(request, "Profile activated.", messages.SUCCESS)

    def changeform_view(
        self, request: HttpRequest, object_id: Optional[str] = None, form_url: str = "",
        extra_context: Optional[dict[str, Any]] = None,
    ) -> HttpResponse:
        if request.method == "POST" and "_preview" in request.POST:
            return self._preview(request, object_id, form_url)
        profile = self.get_object(request, unquote(object_id)) if object_id else None
        suggestions = self._preview_conversations(request, profile.project_id if profile else None)
        # Prefilled with the conversation a compression changes most, so Preview shows
        # an effect on the first press (a short conversation compresses to itself).
        initial = {"preview_conversation": suggestions[0].external_id} if suggestions else {}
        extra_context = {**(extra_context or {}), "preview_form": PreviewForm(initial=initial),
                         "preview_conversations": suggestions}
        return super().changeform_view(request, object_id, form_url, extra_context)

    def _preview_conversations(self, request: HttpRequest, project_id: Optional[int] = None) -> list[Conversation]:
        """Of the latest conversations, those whose context grew largest first."""
        qs = Conversation.objects.all()
        if not request.user.is_superuser:
            qs = qs.filter(project__in=projects_for_user(request.user))
        if project_id is not None:
            qs = qs.filter(project_id=project_id)
        latest = list(qs.order_by("-last_activity_at")
                      .only("id", "external_id", "title", "project_id", "max_context_tokens")[:PREVIEW_CANDIDATES])
        latest.sort(key=lambda c: c.max_context_tokens or 0, reverse=True)
        return latest[:PREVIEW_SUGGESTIONS]

    def _preview(self, request: HttpRequest, object_id: Optional[str], form_url: str) -> HttpResponse:
        """Validate the edited profile and run compression with it; save nothing."""
        add = object_id is None
        obj = None
        if not add:
            obj = self.get_object(request, unquote(object_id))
            if obj is None:
                raise Http404("no such profile")
            if not self.has_change_permission(request, obj):
                raise PermissionDenied
        elif not self.has_add_permission(request):
            raise PermissionDenied
        form = self.get_form(request, obj, change=not add)(request.POST, instance=obj)
        preview_form = PreviewForm(request.POST)
        preview: dict[str, Any] = {}
        if form.is_valid() and preview_form.is_valid():
            conversation = self._find_conversation(
                request, form.cleaned_data["project"], preview_form.cleaned_data["preview_conversation"]
            )
            if conversation is None:
                preview_form.add_error("preview_conversation", "No such conversation in this project.")
            else:
                try:
                    config = ContextCompressionConfig.from_dict(form.cleaned_data["config"])
                    result, count = compression_preview(
                        config, conversation, target_tokens=preview_form.cleaned_data["preview_target_tokens"]
                    )
                except ValueError as exc:  # ConfigError is a ValueError
                    preview_form.add_error(None, f"Compression refused: {exc}")
                else:
                    preview = {"diff": compression_diff(result.model_dump(mode="json")),
                               "conversation": conversation, "message_count": count}
        if not form.is_valid():
            preview_form.add_error(None, "Fix the profile's errors first.")
        fieldsets = self.get_fieldsets(request, obj)
        admin_form = helpers.AdminForm(
            form, list(fieldsets), self.get_prepopulated_fields(request, obj),
            self.get_readonly_fields(request, obj), model_admin=self,
        )
        context = {
            **self.admin_site.each_context(request),
            "title": ("Add %s" if add else "Change %s") % self.opts.verbose_name,
            "subtitle": str(obj) if obj else None,
            "adminform": admin_form,
            "object_id": object_id,
            "original": obj,
            "is_popup": False,
            "to_field": None,
            "media": self.media + admin_form.media,
            "inline_admin_formsets": [],
            "errors": helpers.AdminErrorList(form, []),
            "preserved_filters": self.get_preserved_filters(request),
            "preview_form": preview_form,
            "preview_conversations": self._preview_conversations(request, obj.project_id if obj else None),
            "preview": preview,
        }
        request.current_app = self.admin_site.name
        return self.render_change_form(request, context, add=add, change=not add, obj=obj, form_url=form_url)

    def _find_conversation(self, request: HttpRequest, project: Any, key: str) -> Optional[Conversation]:
        if project is None:
            return None
        if not request.user.is_superuser and not projects_for_user(request.user).filter(pk=project.pk).exists():
            return None
        qs = Conversation.objects.filter(project=project)
        found = qs.filter(external_id=key).first()
        if found is None and key.isdigit():
            found = qs.filter(pk=int(key)).first()
        return found


@admin.register(ToolOutputPolicy)
class ToolOutputPolicyAdmin(_ConfigAdmin):
    list_display = ["tool_name", "project", "output_level", "cache_policy", "updated_at"]
    search_fields = ["tool_name"]


@admin.register(EncoderRule)
class EncoderRuleAdmin(_ConfigAdmin):
    list_display = ["pattern", "project", "safety_margin", "updated_at"]


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(ProjectScopedAdmin):
    list_display = ["project", "span_days", "record_days", "artifact_days"]


@admin.register(PriceRule)
class PriceRuleAdmin(admin.ModelAdmin):
    """The global price table: staff read it, superusers change it. A saved or
    deleted rule re-prices, after commit, what its old and new patterns match."""

    list_display = ["pattern", "input_usd_per_million", "output_usd_per_million", "effective_from", "source"]
    search_fields = ["pattern"]
    ordering = ["pattern", "-effective_from"]
    readonly_fields = ["updated_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_active and request.user.is_staff

    def save_model(self, request: HttpRequest, obj: PriceRule, form: Any, change: bool) -> None:
        before = PriceRule.objects.filter(pk=obj.pk).values_list("pattern", flat=True).first() if change else None
        super().save_model(request, obj, form, change)
        prices_changed(patterns=[before, obj.pattern])

    def delete_model(self, request: HttpRequest, obj: PriceRule) -> None:
        pattern = obj.pattern
        super().delete_model(request, obj)
        prices_changed(patterns=[pattern])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        patterns = list(queryset.values_list("pattern", flat=True))
        super().delete_queryset(request, queryset)
        prices_changed(patterns=patterns)
