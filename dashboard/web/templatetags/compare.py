"""One side of one aligned round of the compare page, built in Python: a page holds a
hundred (50 rounds, two sides), where the template include cost about 1 ms each,
most of the page's time. The HTML is what the include it replaced (partials/compare_side.html) made;
every value is escaped by format_html."""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from .observatory import clip, duration, pretty_json, round_number, tokens, usd

register = template.Library()


def _changed(differs: Any, *aspects: str) -> str:
    return " changed" if any(aspect in differs for aspect in aspects) else ""


def _tool_call(t: Any, differs: Any) -> SafeString:
    row = t.row
    outcome = (mark_safe('<span class="badge ok">ok</span>') if row["success"] else
               format_html('<span class="badge error">{}</span>', row["error_type"] or "failed"))
    retries = row["retry_count"]
    retried = format_html('<span class="badge warn">{} retr{}</span>', retries, "y" if retries == 1 else "ies") \
        if retries else ""
    observed = ("tokens unknown" if row["observation_tokens"] is None else
                format_html("{} tokens · {}", tokens(row["observation_tokens"]), usd(t.cost_pico_usd)))
    return format_html(
        '<div class="event tool-call{}" data-aspect="tool"><div class="meta"><span class="name">{}</span> '
        '<span class="badge level-{}">{}</span> {} {} <span data-field="observation-tokens">{}</span>'
        '<span>{}</span></div><pre class="args">{}</pre></div>',
        _changed(differs, "tools", "levels", "errors"), row["tool_name"], row["output_level"],
        str(row["output_level"]).upper(), outcome, retried, observed, duration(row["duration_ms"]),
        clip(t.arguments, 400))


def _compression(c: dict[str, Any], differs: Any, slug: str) -> SafeString:
    config = format_html('<pre class="small">{}</pre>', pretty_json(c["config"])) if c["config"] else ""
    return format_html(
        '<div class="event compression{}" data-aspect="compression"><div class="who">Compression</div> '
        '<span class="badge warn">{}</span> <span class="small">{} → {} tokens</span> '
        '<a class="small" href="{}">diff</a> {}</div>',
        _changed(differs, "compressions"), c["mode"], tokens(c["tokens_before"]), tokens(c["tokens_after"]),
        reverse("web:compression", args=[slug, c["id"]]), config)


@register.simple_tag(takes_context=True)
def compare_side(context: Any, side: Any, conversation_url: str, differs: Any) -> SafeString:
    """One conversation's round at one position (``side``: selectors.compare.SideRound,
    or None when it has no round there), its aspects in ``differs`` marked changed."""
    if side is None:
        return mark_safe('<div class="compare-side"><p class="muted small">no round at this position</p></div>')
    r = side.round
    number = round_number(r["index"])
    window = format_html(" / {}", tokens(r["context_window"])) if r["context_window"] else ""
    head = format_html(
        '<div class="round-head"><a href="{}#round-{}">round {}</a> <span class="badge {}">{}</span> '
        '<span class="small{}" data-aspect="context">context {}{}</span> '
        '<span class="small">in {} · out {} · {}</span></div>',
        conversation_url, number, number, "error" if r["status"] == "error" else "ok", r["status"],
        _changed(differs, "context"), tokens(side.context_tokens), window, tokens(r["input_tokens"]),
        tokens(r["output_tokens"]), usd(r["cost_pico_usd"]))
    user = format_html('<div class="event user{}" data-aspect="user_message"><div class="who">User</div>'
                       '<div class="text">{}</div></div>', _changed(differs, "user_message"),
                       clip(r["user_message"], 600)) if r["user_message"] else ""
    answer = format_html('<div class="event answer{}" data-aspect="final_answer"><div class="who">Final answer'
                         '</div><div class="text">{}</div></div>', _changed(differs, "final_answer"),
                         clip(r["final_answer"], 600)) if r["final_answer"] else ""
    slug = context["project"].slug
    return format_html(
        '<div class="compare-side">{}{}{}{}{}</div>', head, user,
        format_html_join("", "{}", ((_tool_call(t, differs),) for t in side.tools)),
        format_html_join("", "{}", ((_compression(c, differs, slug),) for c in side.compressions)), answer)
