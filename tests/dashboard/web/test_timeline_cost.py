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
    header = re.search(r'data-testid="conversation-cost">(.*?)</span>\s*</span>', body, re.S).group(1)
    assert usd_text(conversation.cost_pico_usd) in header and "1 round with no price" in header
    shown = re.findall(r'data-testid="round-cost">([^<]*)<', body)
    rounds = Round.objects.filter(conversation=conversation).order_by("index")
    assert shown == [usd_text(r.cost_pico_usd) for r in rounds] == [usd_text(rounds[0].cost_pico_usd), "no price"]
    assert f'data-copy="{conversation.external_id}"' in body
