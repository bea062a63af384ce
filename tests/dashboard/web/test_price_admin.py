"""The price table in the admin: superusers edit it, staff read it, a rule may
name any model or pattern, and a saved rule re-prices the stored conversations."""

from __future__ import annotations

import pytest
from tests.dashboard.web.pages_factories import round_record, store

from dashboard.observatory.models import Conversation
from dashboard.tuning.models import PriceRule

pytestmark = pytest.mark.django_db
ADD = "/admin/tuning/pricerule/add/"


def form(**extra):
    return {"pattern": "deepseek-chat*", "input_usd_per_million": "0.27", "output_usd_per_million": "1.10",
            "effective_from": "2020-01-01", "source": "test", **extra}


@pytest.fixture
def root_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", password="pw-root-123456"))
    return client


def test_it_adds_a_rule_and_reprices_what_it_matches(root_client, project, django_capture_on_commit_callbacks):
    store(project, [round_record("c", 0, model="deepseek-chat")])
    assert Conversation.objects.get().cost_pico_usd is None
    with django_capture_on_commit_callbacks(execute=True):
        response = root_client.post(ADD, form())
    assert response.status_code == 302
    assert Conversation.objects.get().cost_pico_usd == 900 * 270_000 + 100 * 1_100_000


@pytest.mark.parametrize("pattern", ["scripted-analyst-1", "my-own-model*", "*"])
def test_it_takes_a_rule_for_any_model_or_pattern(root_client, project, pattern, django_capture_on_commit_callbacks):
    store(project, [round_record("c", 0, model="scripted-analyst-1")])
    with django_capture_on_commit_callbacks(execute=True):
        response = root_client.post(ADD, form(pattern=pattern))
    assert response.status_code == 302
    matches = pattern != "my-own-model*"
    assert Conversation.objects.get().cost_pico_usd == (900 * 270_000 + 100 * 1_100_000 if matches else None)


def test_it_escapes_a_hostile_model_name_it_took(root_client):
    assert root_client.post(ADD, form(pattern="<script>alert(1)</script>")).status_code == 302
    body = root_client.get("/admin/tuning/pricerule/").content.decode()
    assert "<script>alert(1)</script>" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body


@pytest.mark.parametrize("pattern", ["", "   "])
def test_it_refuses_a_rule_that_names_nothing(root_client, pattern):
    response = root_client.post(ADD, form(pattern=pattern))
    assert response.status_code == 200 and b"errorlist" in response.content
    assert not PriceRule.objects.filter(source="test").exists()


@pytest.mark.parametrize("field, value", [("input_usd_per_million", "abc"), ("output_usd_per_million", "-2"),
                                          ("effective_from", "yesterday"), ("input_usd_per_million", "1" * 40)])
def test_it_refuses_bad_numbers_and_dates(root_client, field, value):
    response = root_client.post(ADD, form(**{field: value}))
    assert response.status_code == 200 and b"errorlist" in response.content
    assert not PriceRule.objects.filter(source="test").exists()


def test_it_lets_staff_read_but_not_change_the_table(client, django_user_model):
    staff = django_user_model.objects.create_user("st", password="pw-staff-123456", is_staff=True)
    client.force_login(staff)
    assert client.get("/admin/tuning/pricerule/").status_code == 200
    assert client.post(ADD, form()).status_code == 403
    rule = PriceRule.objects.first()
    assert client.post(f"/admin/tuning/pricerule/{rule.pk}/delete/", {"post": "yes"}).status_code == 403
    assert PriceRule.objects.filter(pk=rule.pk).exists()
