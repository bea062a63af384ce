"""Cost on the conversation timeline (the cost partials): the conversation's and
each round's, "no price" for a model the table does not know."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import round_record, store

from dashboard.observatory.models import Conversation, Round
from dashboard.web.costs import usd_text

pytestmark = pytest.mark.django_db


def test_it_shows_the_conversation_and_round_costs(client_in, project):
    store(project, [round_record("c", 0), round_record("c", 1, model="acme-large")])
    conversation = Conversation.objects.get()
    body = client_in.get(reverse("web:conversation", args=[project.slug, conversation.pk])).content.decode()
    header = re.sub(r"<[^>]+>", "", re.search(r'data-testid="conversation-cost">(.*?)</span>\s*</span>', body, re.S).group(1))
    assert header == f"cost {usd_text(conversation.cost_pico_usd)} (1 round without a price left out)"
    shown = re.findall(r'data-testid="round-cost">([^<]*)<', body)
    rounds = Round.objects.filter(conversation=conversation).order_by("index")
    assert shown == [usd_text(r.cost_pico_usd) for r in rounds] == [usd_text(rounds[0].cost_pico_usd), "no price"]
    assert f'data-copy="{conversation.external_id}"' in body


def test_it_says_no_price_once_when_no_round_has_one(client_in, project):
    store(project, [round_record("c", 0, model="acme-large"), round_record("c", 1, model="acme-large")])
    conversation = Conversation.objects.get()
    body = client_in.get(reverse("web:conversation", args=[project.slug, conversation.pk])).content.decode()
    header = re.sub(r"<[^>]+>", "", re.search(r'data-testid="conversation-cost">(.*?)</span>\s*</span>', body, re.S).group(1))
    assert header == "cost no price (2 rounds)"
    listed = client_in.get(reverse("web:conversations", args=[project.slug]) + "?user=user-1").content.decode()
    said = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", re.search(r'data-testid="user-cost">(.*?)</p>', listed, re.S).group(1)))
    assert said.endswith("1 conversation listed, cost no price (2 rounds).")
    row = re.sub(r"<[^>]+>", "", re.search(r'data-field="cost">(.*?)</td>', listed, re.S).group(1))
    assert row == "no price (2 rounds)"
