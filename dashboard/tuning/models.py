"""Config the admin edits per project; ``services.effective_config`` turns it into the
payload agents fetch from ``GET /api/v1/config``.

Each model validates through the pipeline's own config classes, so the dashboard
can never hand an agent a config the library would refuse.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from dashboard.accounts.models import Project
from pipeline import OutputLevel, ToolCachePolicy

from .patterns import match_rank, normalized


def _payload_accepts(name: str, values: dict[str, Any], field: str) -> None:
    """Refuse what the agent-side ConfigPayload would refuse (its bounds can be
    tighter than the config class's own, e.g. the margin range)."""
    from pipeline import ConfigPayload
    from pydantic import ValidationError as PayloadError

    try:
        ConfigPayload.model_validate({name: values})
    except PayloadError as exc:
        raise ValidationError({field: exc.errors()[0]["msg"]}) from None


class CompressionProfile(models.Model):
    """A named ContextCompressionConfig; at most one is active per project."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="compression_profiles")
    name = models.CharField(max_length=100)
    config = models.JSONField(default=dict, help_text="ContextCompressionConfig fields; defaults fill the rest")
    is_active = models.BooleanField(default=False)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="compression_profile_name_unique"),
            models.UniqueConstraint(
                fields=["project"], condition=Q(is_active=True), name="compression_profile_one_active"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}{' (active)' if self.is_active else ''}"

    def clean(self) -> None:
        from pipeline import ContextCompressionConfig, PipelineError

        try:
            ContextCompressionConfig.from_dict(self.config)
        except (PipelineError, ValueError, TypeError) as exc:
            raise ValidationError({"config": str(exc)}) from None
        _payload_accepts("compression", self.config, "config")

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.updated_at = timezone.now()
        super().save(*args, **kwargs)


class ToolOutputPolicy(models.Model):
    """The output level and cache policy a tool should use in this project."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tool_policies")
    tool_name = models.CharField(max_length=200)
    output_level = models.CharField(
        max_length=16, choices=[(level.value, level.name) for level in OutputLevel],
        default=OutputLevel.STANDARD.value,
    )
    cache_policy = models.CharField(
        max_length=16, choices=[(policy.value, policy.name) for policy in ToolCachePolicy],
        default=ToolCachePolicy.NO_CACHE.value,
    )
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "tool output policies"
        ordering = ["tool_name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "tool_name"], name="tool_policy_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name}: {self.output_level}, {self.cache_policy}"

    def clean(self) -> None:
        _payload_accepts("tool_output_levels", {self.tool_name: self.output_level}, "tool_name")

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.updated_at = timezone.now()
        super().save(*args, **kwargs)


class EncoderRule(models.Model):
    """The token-count safety margin for the model families matching ``pattern``: a
    family name (``claude``) or a wildcard over family names (``*``, ``g*``). An
    exact family rule wins over a wildcard; the agent receives one margin per family
    (``ConfigPayload.encoder_margins``)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="encoder_rules")
    pattern = models.CharField(max_length=64, help_text="model family (claude, gpt, ...) or a wildcard such as *")
    safety_margin = models.FloatField(default=1.0, help_text="multiplies token estimates; 1.0 to 3.0")
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["pattern"]
        constraints = [
            models.UniqueConstraint(fields=["project", "pattern"], name="encoder_rule_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.pattern} ×{self.safety_margin}"

    def families(self) -> list[str]:
        from pipeline import ModelFamily

        return [family.value for family in ModelFamily if match_rank(self.pattern, family.value) is not None]

    def clean(self) -> None:
        from pipeline import EncoderConfig, PipelineError

        families = self.families()
        if not families:
            raise ValidationError({"pattern": "matches no model family"})
        try:
            for family in families:
                EncoderConfig.from_dict({"model_family": family, "safety_margin": self.safety_margin})
        except (PipelineError, ValueError, TypeError) as exc:
            raise ValidationError({"safety_margin": str(exc)}) from None
        _payload_accepts("encoder_margins", {families[0]: self.safety_margin}, "safety_margin")

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.updated_at = timezone.now()
        super().save(*args, **kwargs)


class ConfigRevision(models.Model):
    """A per-project counter bumped whenever the agent-facing config changes, shown
    to agents as ``revision`` (the ETag itself hashes the content)."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="config_revision")
    revision = models.PositiveIntegerField(default=0)
    changed_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"revision {self.revision}"


class RetentionPolicy(models.Model):
    """How long a project's data is kept; without one the settings' defaults apply."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="retention")
    span_days = models.PositiveIntegerField(default=14)
    record_days = models.PositiveIntegerField(default=90)
    artifact_days = models.PositiveIntegerField(default=30)

    class Meta:
        verbose_name_plural = "retention policies"

    def __str__(self) -> str:
        return f"spans {self.span_days}d, records {self.record_days}d, artifacts {self.artifact_days}d"

    def clean(self) -> None:
        for field in ("span_days", "record_days", "artifact_days"):
            if getattr(self, field) < 1:
                raise ValidationError({field: "keep data at least one day"})


class PriceRule(models.Model):
    """What a model's tokens cost, in USD per million, from a date on.

    ``pattern`` is a model name or a wildcard over model names (``gpt-4o*``,
    ``claude-3-5-sonnet*``), matched like the encoder rules (``patterns``): the
    most specific matching pattern wins, and of its rules the one with the latest
    ``effective_from`` on or before the day the tokens were used. So a price change
    is a new row, and what was spent before it keeps the price then in force.

    The table is global (list prices do not depend on the project); a model that
    no rule matches has no price, and the pages say so rather than show 0.
    """

    pattern = models.CharField(
        max_length=100, help_text="model name or wildcard, e.g. gpt-4o* or claude-3-5-sonnet*",
    )
    input_usd_per_million = models.DecimalField(max_digits=12, decimal_places=6)
    output_usd_per_million = models.DecimalField(max_digits=12, decimal_places=6)
    effective_from = models.DateField(help_text="the first day (UTC) this price applies to")
    source = models.CharField(max_length=300, blank=True, help_text="where the price was read, and when")
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["pattern", "-effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["pattern", "effective_from"], name="price_rule_unique"),
        ]

    def __str__(self) -> str:
        return (f"{self.pattern}: ${self.input_usd_per_million} in / ${self.output_usd_per_million} out "
                f"per 1M from {self.effective_from}")

    def clean(self) -> None:
        # Any model name or pattern: a gateway's alias, a fine-tune, a self-hosted
        # model or the demo's scripted one has a price as much as a vendor's model
        # (a narrower pattern still wins over a wide one such as "*").
        self.pattern = normalized(self.pattern or "")
        if not self.pattern:
            raise ValidationError({"pattern": "name a model, or a wildcard such as gpt-4o* or *"})
        for field in ("input_usd_per_million", "output_usd_per_million"):
            value = getattr(self, field)
            if value is not None and (value < 0 or value > Decimal("100000")):
                raise ValidationError({field: "a price from 0 to 100,000 USD per million tokens"})

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.pattern = normalized(self.pattern)
        self.updated_at = timezone.now()
        super().save(*args, **kwargs)
