"""Read-mostly admin views of the stored data (the pages are the real UI)."""

from django.contrib import admin

from .models import Artifact, CompressionEvent, Conversation, Span, ToolExecution, ToolHourlyRollup


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ["external_id", "title", "project", "model", "status", "rounds", "tool_calls", "errors", "last_activity_at"]
    list_filter = ["project", "status", "has_errors"]
    search_fields = ["external_id", "title"]
    readonly_fields = [f.name for f in Conversation._meta.fields]


@admin.register(ToolExecution)
class ToolExecutionAdmin(admin.ModelAdmin):
    list_display = ["tool_name", "tool_call_id", "project", "success", "duration_ms", "output_level", "occurred_at"]
    list_filter = ["project", "success", "output_level"]
    search_fields = ["tool_name", "tool_call_id"]
    raw_id_fields = ["conversation", "linked_span"]


@admin.register(CompressionEvent)
class CompressionEventAdmin(admin.ModelAdmin):
    list_display = ["conversation", "mode", "tokens_before", "tokens_after", "occurred_at"]
    raw_id_fields = ["conversation"]


@admin.register(Span)
class SpanAdmin(admin.ModelAdmin):
    list_display = ["name", "trace_id", "span_id", "project", "duration_ms", "status_code", "start_time"]
    list_filter = ["project"]
    search_fields = ["trace_id", "span_id", "tool_call_id"]
    raw_id_fields = ["conversation"]


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ["artifact_id", "project", "size", "content_type", "created_at", "expires_at"]
    list_filter = ["project"]
    search_fields = ["artifact_id"]
    exclude = ["file"]  # the storage path is never shown
    raw_id_fields = ["conversation", "tool_execution"]


@admin.register(ToolHourlyRollup)
class ToolHourlyRollupAdmin(admin.ModelAdmin):
    list_display = ["tool_name", "project", "hour", "calls", "errors", "retries"]
    list_filter = ["project"]
