"""What OTLP metrics leave behind: bounded rows, never every data point.

- ``MetricHour``: per project, hour, metric and (model, tool, token type) the sum of
  the points' increments in that hour (``value``: tokens, seconds, milliseconds or
  calls, in the metric's own unit) and, for a histogram, of its observations
  (``count``). One row per key and hour, whatever the export interval.
- ``MetricSeries``: the last point seen of each series (a metric and its attribute
  set, from one resource), so that a cumulative point, which carries the total since
  the series started, is stored as its increment over the previous one, and a point
  sent again (an exporter's retry) adds nothing.
- ``OtherMetric``: metrics the dashboard does not chart, counted by name.
"""

from __future__ import annotations

from django.db import models

from dashboard.accounts.models import Project

NAME_LENGTH = 200


class MetricHour(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    hour = models.DateTimeField()  # UTC, on the hour: the hour the points' times fall in
    name = models.CharField(max_length=NAME_LENGTH)  # gen_ai.client.token.usage, ba.tool.calls, ...
    model = models.CharField(max_length=NAME_LENGTH, blank=True)  # by the conventions table ("" when none)
    tool_name = models.CharField(max_length=NAME_LENGTH, blank=True)  # gen_ai.tool.name (the pipeline's)
    token_type = models.CharField(max_length=16, blank=True)  # gen_ai.token.type: input / output
    value = models.FloatField(default=0)  # sum of the increments (a histogram's: of its sums)
    count = models.BigIntegerField(default=0)  # a histogram's observations; 0 for a sum

    class Meta:
        constraints = [
            # one row per key and hour; also the page's read (project, hour range)
            models.UniqueConstraint(fields=["project", "hour", "name", "model", "tool_name", "token_type"],
                                    name="metrichour_unique"),
        ]


class MetricSeries(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=32)  # hash of the resource, scope, metric name and attributes
    start_time_unix_nano = models.BigIntegerField(default=0)  # the series' start (a new one: a reset)
    time_unix_nano = models.BigIntegerField(default=0)  # the last point's time
    value = models.FloatField(default=0)  # the last point's (cumulative) value or histogram sum
    count = models.BigIntegerField(default=0)  # the last histogram point's count
    seen_at = models.DateTimeField()  # retention: series not seen for long are forgotten

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "key"], name="metricseries_unique")]


class OtherMetric(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    name = models.CharField(max_length=NAME_LENGTH)
    points = models.BigIntegerField(default=0)  # data points accepted under this name
    last_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="othermetric_unique")]
