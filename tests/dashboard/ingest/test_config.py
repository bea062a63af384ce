"""GET /api/v1/config: the effective config as a pipeline ConfigPayload with ETag."""

from __future__ import annotations

import pytest

from dashboard.tuning.models import CompressionProfile, EncoderRule, ToolOutputPolicy
from dashboard.tuning.services import config_revision_bump
from pipeline import ConfigPayload, EffectiveConfig

pytestmark = pytest.mark.django_db
URL = "/api/v1/config"


def test_it_serves_the_projects_config_as_a_pipeline_payload(client, auth, project):
    CompressionProfile.objects.create(project=project, name="tight", config={"threshold_ratio": 0.7}, is_active=True)
    ToolOutputPolicy.objects.create(project=project, tool_name="query_sales", output_level="brief",
                                    cache_policy="ttl_short")
    EncoderRule.objects.create(project=project, pattern="claude", safety_margin=1.2)
    config_revision_bump(project=project)
    response = client.get(URL, **auth)
    assert response.status_code == 200
    payload = ConfigPayload.model_validate_json(response.content)
    config = EffectiveConfig.from_payload(payload)
    assert payload.revision == 1
    assert config.compression == {"threshold_ratio": 0.7}
    assert config.tool_output_levels["query_sales"].value == "brief"
    assert config.tool_cache_policies["query_sales"].value == "ttl_short"
    assert {getattr(f, "value", f): m for f, m in config.encoder_margins.items()} == {"claude": 1.2}


def test_it_answers_304_to_a_matching_etag_and_200_after_a_change(client, auth, project):
    first = client.get(URL, **auth)
    etag = first["ETag"]
    assert etag.startswith('"') and not etag.startswith("W/")
    assert client.get(URL, HTTP_IF_NONE_MATCH=etag, **auth).status_code == 304
    assert client.get(URL, HTTP_IF_NONE_MATCH=f'"other", W/{etag}', **auth).status_code == 304
    ToolOutputPolicy.objects.create(project=project, tool_name="t", output_level="full")
    changed = client.get(URL, HTTP_IF_NONE_MATCH=etag, **auth)
    assert changed.status_code == 200 and changed["ETag"] != etag


def test_it_serves_each_project_only_its_own_config(client, auth, other_auth, project, other_project):
    ToolOutputPolicy.objects.create(project=other_project, tool_name="secret_tool", output_level="full")
    assert "secret_tool" not in client.get(URL, **auth).content.decode()
    assert "secret_tool" in client.get(URL, **other_auth).content.decode()


def test_it_refuses_missing_wrong_and_revoked_keys(client, project):
    from dashboard.accounts.services import apikey_create, apikey_revoke

    key, text = apikey_create(project=project)
    apikey_revoke(key=key)
    for auth in ({}, {"HTTP_AUTHORIZATION": "Bearer x"}, {"HTTP_AUTHORIZATION": f"Bearer {text}"}):
        response = client.get(URL, **auth)
        assert response.status_code == 401 and "error" in response.json()


def test_it_reads_the_config_in_a_fixed_number_of_queries(client, auth, project, django_assert_max_num_queries):
    for i in range(30):
        ToolOutputPolicy.objects.create(project=project, tool_name=f"tool_{i}", output_level="brief")
        EncoderRule.objects.create(project=project, pattern=f"g*{i}" if i else "*", safety_margin=1.1)
    client.get(URL, **auth)  # first use writes last_used_at
    with django_assert_max_num_queries(5):
        assert client.get(URL, **auth).status_code == 200
