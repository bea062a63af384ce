"""The metrics in the admin, read only: the hourly rows and the other metrics' counts."""

from django.contrib import admin

from .models import MetricHour, OtherMetric


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(MetricHour)
class MetricHourAdmin(_ReadOnly):
    list_display = ("project", "hour", "name", "model", "tool_name", "token_type", "value", "count")
    list_filter = ("name",)


@admin.register(OtherMetric)
class OtherMetricAdmin(_ReadOnly):
    list_display = ("project", "name", "points", "last_at")
    search_fields = ("name",)
