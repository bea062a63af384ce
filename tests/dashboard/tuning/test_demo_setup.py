"""What ``manage.py seed_demo`` sets up beside the demo's conversations: a price for
the demo's model (so every cost page shows figures), and a compression profile and a
tool output policy fitted to its window (so Tuning is not empty and a preview on a
demo conversation shows an effect on the first press)."""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from tests.dashboard.web.pages_factories import round_record, store

from dashboard.observatory.models import Conversation
from dashboard.tuning.models import CompressionProfile, ConfigRevision, PriceRule, ToolOutputPolicy
from dashboard.tuning.pricing import PriceTable
from dashboard.tuning.services import effective_config
from pipeline.demo.agent import DEFAULT_CONTEXT_WINDOW, DemoAgent, demo_compression_config
from pipeline.demo.data import build_sales_database
from pipeline.demo.model import ScriptedModel
from pipeline.demo.scenarios import SCENARIOS

pytestmark = pytest.mark.django_db
MODEL = ScriptedModel.name


def seed(project) -> str:
    out = io.StringIO()
    call_command("seed_demo", project.slug, stdout=out)
    return out.getvalue()


def test_it_prices_the_demo_model(project, django_capture_on_commit_callbacks):
    store(project, [round_record("before", 0, model=MODEL)])
    assert Conversation.objects.get(external_id="before").cost_pico_usd is None
    with django_capture_on_commit_callbacks(execute=True):
        said = seed(project)
    assert f"price of {MODEL}: $3.00 in / $15.00 out per million tokens (added)" in said
    store(project, [round_record("after", 0, model=MODEL)])
    price = PriceTable.load().price_for(MODEL, Conversation.objects.get(external_id="after").started_at)
    for external_id in ("before", "after"):  # re-priced, and priced as it arrives
        conversation = Conversation.objects.get(external_id=external_id)
        assert conversation.cost_pico_usd == price.cost(conversation.input_tokens, conversation.output_tokens) > 0
        assert conversation.unpriced_rounds == 0


def test_it_fits_a_profile_and_a_policy_to_the_demo_models_window(project):
    seed(project)
    profile = CompressionProfile.objects.get(project=project)
    assert profile.is_active and profile.config == demo_compression_config().to_dict()
    assert profile.config["max_tokens"] == DEFAULT_CONTEXT_WINDOW
    policy = ToolOutputPolicy.objects.get(project=project)
    assert (policy.tool_name, policy.output_level, policy.cache_policy) == ("query_database", "standard", "ttl_medium")
    served = effective_config(project=project)  # what the demo agent fetches at its start
    assert served.compression["max_tokens"] == DEFAULT_CONTEXT_WINDOW
    assert served.tool_output_levels == {"query_database": "standard"}
    assert served.tool_cache_policies == {"query_database": "ttl_medium"}


def test_it_changes_nothing_on_a_second_run_or_after_an_edit(project):
    seed(project)
    profile = CompressionProfile.objects.get(project=project)
    profile.config = {**profile.config, "keep_recent": 9}
    profile.save()
    PriceRule.objects.filter(pattern=MODEL).update(input_usd_per_million=7)
    revision = ConfigRevision.objects.get(project=project).revision
    said = seed(project)
    assert said.count("kept") == 3 and "added" not in said and "$7.00 in" in said
    assert CompressionProfile.objects.get(project=project).config["keep_recent"] == 9
    assert PriceRule.objects.get(pattern=MODEL).input_usd_per_million == 7
    assert ToolOutputPolicy.objects.filter(project=project).count() == 1
    assert ConfigRevision.objects.get(project=project).revision == revision


def test_it_leaves_a_project_with_its_own_profile_alone(project):
    CompressionProfile.objects.create(project=project, name="mine", config={}, is_active=True)
    seed(project)
    assert list(CompressionProfile.objects.filter(project=project).values_list("name", flat=True)) == ["mine"]


def test_it_refuses_an_unknown_project():
    with pytest.raises(CommandError, match="no project"):
        call_command("seed_demo", "no-such-project", stdout=io.StringIO())


def _demo_conversations(project, tmp_path: Path, keys: list[str]) -> None:
    """Play demo scenarios offline and store what the agent sends."""

    class Outbox:
        def __init__(self) -> None:
            self.records: list = []

        def submit(self, record) -> None:
            self.records.append(record)

        def upload_artifact(self, *args) -> None:
            pass

    outbox = Outbox()
    agent = DemoAgent.create(model=ScriptedModel(), database_path=build_sales_database(tmp_path / "sales.sqlite3"),
                             artifact_dir=tmp_path / "artifacts", exporter=outbox)
    for scenario in (s for s in SCENARIOS if s.key in keys):
        agent.run_conversation(scenario, conversation_id=f"demo-{scenario.key}", user_id="ana")
    store(project, [json.loads(r.model_dump_json()) for r in outbox.records])


def test_it_previews_an_effect_on_the_first_press(client, django_user_model, project, tmp_path):
    _demo_conversations(project, tmp_path, ["growth_division_error", "long_analysis", "missing_report"])
    seed(project)
    client.force_login(django_user_model.objects.create_superuser("root", password="pw-root-123456"))
    profile = CompressionProfile.objects.get(project=project)
    url = reverse("admin:tuning_compressionprofile_change", args=[profile.pk])
    page = client.get(url).content.decode()
    prefilled = html.unescape(re.search(r'name="preview_conversation"[^>]*value="([^"]*)"', page).group(1))
    assert prefilled == "demo-long_analysis"  # the one whose context grew largest
    body = client.post(url, {"project": project.pk, "name": profile.name, "config": json.dumps(profile.config),
                             "is_active": "on", "preview_conversation": prefilled, "_preview": "Preview"}).content.decode()
    assert 'data-testid="preview-result"' in body
    before, after = map(int, re.search(r"tokens (\d+) → (\d+)", body).groups())
    assert after < before
    counts = re.search(r"(\d+) kept, (\d+) dropped, (\d+) truncated, (\d+) summarised", body).groups()
    assert sum(map(int, counts[1:])) > 0
