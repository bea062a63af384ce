"""The tuning models' validation (the pipeline's own) and the effective config."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from dashboard.tuning.models import CompressionProfile, EncoderRule, RetentionPolicy
from dashboard.tuning.services import compression_profile_activate, config_body_and_etag, effective_config

pytestmark = pytest.mark.django_db


def margins_of(payload) -> dict[str, float]:
    return {getattr(family, "value", family): margin for family, margin in payload.encoder_margins.items()}


def test_it_validates_compression_profiles_with_the_pipeline_config(project):
    CompressionProfile(project=project, name="ok", config={"strategy": "truncate", "keep_recent": 4}).full_clean()
    for config in ({"threshold_ratio": 7}, {"no_such_field": 1}, {"strategy": "magic"}):
        with pytest.raises(ValidationError):
            CompressionProfile(project=project, name="bad", config=config).full_clean()


def test_it_allows_one_active_profile_per_project(project):
    CompressionProfile.objects.create(project=project, name="a", is_active=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        CompressionProfile.objects.create(project=project, name="b", is_active=True)


def test_it_switches_the_active_profile(project):
    first = CompressionProfile.objects.create(project=project, name="a", is_active=True, config={"keep_recent": 3})
    second = CompressionProfile.objects.create(project=project, name="b", config={"keep_recent": 9})
    compression_profile_activate(profile=second)
    first.refresh_from_db()
    assert not first.is_active
    assert effective_config(project=project).compression == {"keep_recent": 9}
    assert effective_config(project=project).revision == 1


def test_it_validates_encoder_rules(project):
    EncoderRule(project=project, pattern="claude", safety_margin=1.15).full_clean()
    EncoderRule(project=project, pattern="*", safety_margin=1.3).full_clean()
    for pattern, margin in (("nothing-matches", 1.2), ("claude", 0.5), ("gpt", 11.0)):
        with pytest.raises(ValidationError):
            EncoderRule(project=project, pattern=pattern, safety_margin=margin).full_clean()


def test_it_lets_an_exact_family_rule_win_over_a_wildcard(project):
    EncoderRule.objects.create(project=project, pattern="*", safety_margin=1.3)
    EncoderRule.objects.create(project=project, pattern="g*", safety_margin=1.2)
    EncoderRule.objects.create(project=project, pattern="gpt", safety_margin=1.0)
    margins = margins_of(effective_config(project=project))
    assert (margins["gpt"], margins["gemini"], margins["claude"]) == (1.0, 1.2, 1.3)


def test_it_gives_the_same_etag_for_the_same_content(project):
    assert config_body_and_etag(effective_config(project=project)) == config_body_and_etag(
        effective_config(project=project)
    )


def test_it_refuses_a_retention_of_zero_days(project):
    with pytest.raises(ValidationError):
        RetentionPolicy(project=project, span_days=0).full_clean()


def test_it_leaves_out_rows_the_payload_would_refuse_instead_of_failing(project):
    from dashboard.tuning.models import ToolOutputPolicy

    EncoderRule.objects.create(project=project, pattern="gpt", safety_margin=11.0)  # saved around clean()
    EncoderRule.objects.create(project=project, pattern="claude", safety_margin=1.2)
    ToolOutputPolicy.objects.create(project=project, tool_name="bad\x01name", output_level="brief")
    payload = effective_config(project=project)
    assert margins_of(payload) == {"claude": 1.2}
    assert payload.tool_output_levels == {}
