"""The effective config a project's agents run with, built from the tuning models
and serialized with the pipeline's own ``ConfigPayload`` (one schema both sides)."""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import date
from decimal import Decimal
from typing import Any, Optional

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dashboard.accounts.models import Project
from pipeline import ConfigPayload, ModelFamily
from pydantic import ValidationError

from .models import CompressionProfile, ConfigRevision, EncoderRule, PriceRule, ToolOutputPolicy
from .patterns import best_match

logger = logging.getLogger(__name__)


def effective_config(*, project: Project) -> ConfigPayload:
    """The config for ``GET /api/v1/config``: the active compression profile's
    overrides, each tool's output level and cache policy, one margin per model
    family (``patterns.best_match``: an exact family rule wins over a wildcard;
    among wildcards the most specific). Four queries."""
    profile = CompressionProfile.objects.filter(project=project, is_active=True).first()
    policies = list(ToolOutputPolicy.objects.filter(project=project).order_by("tool_name"))
    rules = [(rule.pattern, rule) for rule in EncoderRule.objects.filter(project=project)]
    margins: dict[str, float] = {}
    for family in ModelFamily:
        matching = best_match(rules, family.value)
        if matching:
            margins[family.value] = matching[0].safety_margin
    revision = ConfigRevision.objects.filter(project=project).values_list("revision", flat=True).first() or 0
    fields = {
        "compression": dict(profile.config) if profile and isinstance(profile.config, dict) else {},
        "tool_output_levels": {p.tool_name: p.output_level for p in policies},
        "tool_cache_policies": {p.tool_name: p.cache_policy for p in policies},
        "encoder_margins": dict(sorted(margins.items())),
    }
    return ConfigPayload(revision=revision, **{name: _accepted(name, values) for name, values in fields.items()})


def _accepted(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """The entries ConfigPayload accepts. Rows are validated when saved through the
    admin; one written around it must not turn every agent's poll into a 500."""
    try:
        ConfigPayload.model_validate({name: values})
        return values
    except ValidationError:
        pass
    if name == "compression":
        logger.warning("compression profile refused by ConfigPayload; serving no overrides")
        return {}
    kept = {}
    for key, value in values.items():
        try:
            ConfigPayload.model_validate({name: {key: value}})
            kept[key] = value
        except ValidationError:
            logger.warning("%s entry %r refused by ConfigPayload; left out", name, key[:80])
    return kept


def config_body_and_etag(payload: ConfigPayload) -> tuple[bytes, str]:
    """Canonical JSON (sorted keys) and a strong ETag over exactly those bytes."""
    body = json.dumps(payload.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()
    return body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def config_revision_bump(*, project: Project) -> int:
    """Count a change of the agent-facing config (admin saves and deletes call it)."""
    with transaction.atomic():
        revision, created = ConfigRevision.objects.get_or_create(project=project)
        ConfigRevision.objects.filter(pk=revision.pk).update(revision=F("revision") + 1, changed_at=timezone.now())
    return ConfigRevision.objects.get(pk=revision.pk).revision


@transaction.atomic
def compression_profile_activate(*, profile: CompressionProfile) -> CompressionProfile:
    """Make one profile the project's active one (the others are deactivated first,
    so the one-active constraint holds at every step)."""
    CompressionProfile.objects.filter(project=profile.project, is_active=True).exclude(pk=profile.pk).update(
        is_active=False
    )
    if not profile.is_active:
        profile.is_active = True
        profile.save(update_fields=["is_active", "updated_at"])
    config_revision_bump(project=profile.project)
    return profile


def prices_changed(*, patterns: list[Optional[str]]) -> None:
    """After price rules with these patterns were saved or deleted: re-price, once
    the change is committed, what the old and new patterns match."""
    from dashboard.observatory.derive.reprice import costs_reprice

    wanted = sorted({p for p in patterns if p})
    transaction.on_commit(lambda: costs_reprice(patterns=wanted), robust=True)


# The demo's price: its scripted model is nobody's product, so the price is made
# up (a mid-range list price), only so that every cost page shows figures.
DEMO_PRICE_USD_PER_MILLION = (Decimal("3"), Decimal("15"))
DEMO_PRICE_SOURCE = "made up for the demo's scripted model (manage.py seed_demo)"
DEMO_PRICE_FROM = date(2020, 1, 1)
DEMO_TOOL_LEVELS = {"query_database": "standard"}  # a preview of rows; FULL only when a call asks, as an artifact


def demo_setup(*, project: Project) -> list[str]:
    """What the demo needs beside its conversations, so the first look shows every
    page at work: a price for the demo's model (without one every cost reads "no
    price"), and, when the project has none yet, a compression profile and a tool
    output policy fitted to that model's small window (without them Tuning starts
    empty and a preview on a demo conversation changes nothing). Run again, it
    changes nothing anyone has edited since. Returns what it did, one line each."""
    from pipeline.demo.agent import DEFAULT_CONTEXT_WINDOW, TOOL_SETTINGS, demo_compression_config
    from pipeline.demo.model import ScriptedModel

    model = ScriptedModel.name
    done: list[str] = []
    input_price, output_price = DEMO_PRICE_USD_PER_MILLION
    with transaction.atomic():
        rule, created = PriceRule.objects.get_or_create(
            pattern=model, effective_from=DEMO_PRICE_FROM,
            defaults={"input_usd_per_million": input_price, "output_usd_per_million": output_price,
                      "source": DEMO_PRICE_SOURCE},
        )
        done.append(f"price of {model}: ${Decimal(rule.input_usd_per_million):,.2f} in / "
                    f"${Decimal(rule.output_usd_per_million):,.2f} out per million tokens "
                    f"({'added' if created else 'kept'})")
        if created:
            prices_changed(patterns=[model])
        changed = False
        if not CompressionProfile.objects.filter(project=project).exists():
            profile = CompressionProfile.objects.create(
                project=project, name=f"{model}, {DEFAULT_CONTEXT_WINDOW:,}-token window",
                config=demo_compression_config(DEFAULT_CONTEXT_WINDOW).to_dict(),
            )
            compression_profile_activate(profile=profile)
            done.append(f"compression profile {profile.name!r}: added and active")
        else:
            done.append("compression profiles: the project has its own, kept")
        for tool, level in DEMO_TOOL_LEVELS.items():
            cache = TOOL_SETTINGS.get(tool, {}).get("cache_policy")
            _, added = ToolOutputPolicy.objects.get_or_create(
                project=project, tool_name=tool,
                defaults={"output_level": level, **({"cache_policy": cache.value} if cache else {})},
            )
            changed = changed or added
            done.append(f"tool output policy for {tool}: {'added' if added else 'kept'}")
        if changed:
            config_revision_bump(project=project)
    return done
