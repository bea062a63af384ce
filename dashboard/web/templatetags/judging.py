"""The score widget's form, built in Python: a timeline page holds one per round and
tool call (hundreds on a long conversation), where a template include cost about
0.3 ms each. Every value is escaped by format_html."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()

FORM = (
    '<form class="score-form" method="post" action="{add}" hx-post="{add}" hx-target="#scores-{target}-{pk}" '
    'hx-swap="outerHTML">'
    '<input type="hidden" name="csrfmiddlewaretoken" value="{csrf}">'
    '<input type="hidden" name="target" value="{target}"><input type="hidden" name="object" value="{pk}">'
    # Enter in a field saves what it says, not thumbs up: this is the form's first button.
    '<button type="submit" class="score-default" tabindex="-1" aria-hidden="true">save</button>'
    '<button type="submit" name="thumb" value="up" class="thumb" data-score-up title="good (key +)" '
    'aria-label="thumbs up">👍</button>'
    '<button type="submit" name="thumb" value="down" class="thumb" data-score-down title="bad (key −)" '
    'aria-label="thumbs down">👎</button>'
    '<details class="score-more" hx-get="{choices}?target={target}&amp;object={pk}" hx-trigger="toggle once" '
    'hx-target="find .score-choices" data-score-more><summary class="small">score…</summary>'
    '<span class="score-choices"></span></details>'
    '<input name="comment" maxlength="2000" placeholder="comment (key c)" aria-label="comment" data-score-comment>'
    '<button type="submit" class="secondary small" data-score-save>save</button>'
    "</form>"
)


@register.simple_tag(takes_context=True)
def score_form(context: Any, target: str, pk: int) -> SafeString:
    """The form that scores one thing (``target``: conversation, round, tool_call), for
    a member; nothing for a viewer. Needs ``score_add_url`` and ``score_form_url``
    (views.scores.widget_urls) and the page's CSRF token."""
    if not context.get("may_judge"):
        return SafeString("")
    return format_html(FORM, add=context["score_add_url"], choices=context["score_form_url"], target=target, pk=pk,
                       csrf=str(context.get("csrf_token", "")))
