"""What the pages read of the metrics: sums of the hourly rows over a range, per
model and per tool, and per model and bucket for the chart. Every figure is a sum
of ``MetricHour`` rows (or of ``OtherMetric`` counts), nothing else.

- per model (the GenAI client metrics): input and output tokens
  (``gen_ai.client.token.usage`` by ``gen_ai.token.type``), model calls (the
  observations of ``gen_ai.client.operation.duration``) and their mean duration;
- per tool (the pipeline's ``ba.tool.*`` counters): calls, errors, retries, cache
  hits, time spent, tokens;
- other metrics: the data points accepted, by name.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Optional

from django.db.models import Sum

from dashboard.accounts.models import Project

from .models import MetricHour, OtherMetric

TOKEN_USAGE = "gen_ai.client.token.usage"
OPERATION_DURATION = "gen_ai.client.operation.duration"
TOOL_COUNTERS = {"ba.tool.calls": "calls", "ba.tool.errors": "errors", "ba.tool.retries": "retries",
                 "ba.tool.cache_hits": "cache_hits", "ba.tool.duration": "duration_ms"}


@dataclass
class ModelMetrics:
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0  # observations of the operation duration
    duration_s: float = 0.0  # their sum
    # the same model's tokens as the conversations' rows give them (spans and records), when the page has them
    derived: Optional[tuple[int, int]] = None

    @property
    def mean_duration_ms(self) -> Optional[float]:
        return 1000 * self.duration_s / self.calls if self.calls else None


@dataclass
class ToolMetrics:
    tool_name: str
    calls: int = 0
    errors: int = 0
    retries: int = 0
    cache_hits: int = 0
    duration_ms: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class MetricFigures:
    by_model: list[ModelMetrics] = field(default_factory=list)
    by_tool: list[ToolMetrics] = field(default_factory=list)
    other_points: int = 0  # data points of other metrics accepted (all time)
    other_names: list[tuple[str, int]] = field(default_factory=list)  # the most sent first, at most OTHER_SHOWN
    other_count: int = 0  # names of other metrics

    @property
    def empty(self) -> bool:
        return not self.by_model and not self.by_tool and not self.other_points


OTHER_SHOWN = 10


def metric_figures(project: Project, *, since: datetime, until: Optional[datetime] = None) -> MetricFigures:
    """The range's sums (hours from ``since``, before ``until``)."""
    rows = MetricHour.objects.filter(project=project, hour__gte=since)
    if until is not None:
        rows = rows.filter(hour__lt=until)
    models: dict[str, ModelMetrics] = {}
    tools: dict[str, ToolMetrics] = {}
    for name, model, tool_name, token_type, value, count in (
        rows.values("name", "model", "tool_name", "token_type").order_by()
        .annotate(value=Sum("value"), count=Sum("count"))
        .values_list("name", "model", "tool_name", "token_type", "value", "count")
    ):
        value, count = value or 0.0, count or 0
        if name in (TOKEN_USAGE, OPERATION_DURATION):
            figures = models.setdefault(model, ModelMetrics(model))
            if name == OPERATION_DURATION:
                figures.calls += count
                figures.duration_s += value
            elif token_type == "input":
                figures.input_tokens += round(value)
            elif token_type == "output":
                figures.output_tokens += round(value)
        else:
            tool = tools.setdefault(tool_name, ToolMetrics(tool_name))
            if name in TOOL_COUNTERS:
                attribute = TOOL_COUNTERS[name]
                setattr(tool, attribute, getattr(tool, attribute) + (value if attribute == "duration_ms" else round(value)))
            elif token_type == "input":
                tool.input_tokens += round(value)
            elif token_type == "output":
                tool.output_tokens += round(value)
    others = list(OtherMetric.objects.filter(project=project).order_by("-points", "name").values_list("name", "points"))
    return MetricFigures(
        by_model=sorted(models.values(), key=lambda m: (-(m.input_tokens + m.output_tokens), m.model)),
        by_tool=sorted(tools.values(), key=lambda t: (-t.calls, t.tool_name)),
        other_points=sum(points for _, points in others),
        other_names=others[:OTHER_SHOWN],
        other_count=len(others),
    )


def metric_series(project: Project, *, edges: list[datetime], until: datetime,
                  index: Callable[[datetime], int]) -> dict[str, Any]:
    """Tokens (input + output) per model and bucket from ``gen_ai.client.token.usage``:
    ``{"models": [...], "tokens": {model: [per bucket]}}``; ``index(hour)`` is the
    bucket of an hour (the page's series' own)."""
    per_model: dict[str, list[int]] = defaultdict(lambda: [0] * len(edges))
    for hour, model, value in (
        MetricHour.objects.filter(project=project, name=TOKEN_USAGE, hour__gte=edges[0], hour__lt=until,
                                  token_type__in=("input", "output"))
        .values("hour", "model").order_by().annotate(value=Sum("value")).values_list("hour", "model", "value")
    ):
        i = index(hour)
        if 0 <= i < len(edges):
            per_model[model][i] += round(value or 0)
    models = sorted(per_model, key=lambda m: (-sum(per_model[m]), m))
    return {"models": models, "tokens": {model: per_model[model] for model in models}}

