"""Formatting filters for the pages.

Every filter returns plain text (never marked safe), so whatever an agent sent is
still escaped by the template engine after formatting.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

from django import template
from django.template.defaultfilters import stringfilter, truncatechars

register = template.Library()


@register.filter
def tokens(value: Any) -> str:
    """12345 -> '12,345'; None -> '—' (a level that was not rendered)."""
    if value is None or value == "":
        return "—"
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


@register.filter(is_safe=True)
@stringfilter
def clip(value: str, length: Any) -> str:
    """truncatechars for the lists, with its rules (text, escaping): a text already
    short enough is returned as it is (Django's filter walks every character of
    every value, ~25 µs each, which a page of a few hundred cells pays in
    milliseconds); a longer one, or a bad length, goes through truncatechars."""
    try:
        if len(value) <= int(length):
            return unicodedata.normalize("NFC", value)  # as truncatechars gives it back (cheap when it already is)
    except (TypeError, ValueError):
        pass
    return truncatechars(value, length)


@register.filter
def duration(value: Any) -> str:
    """Milliseconds for people: '850 ms', '1.25 s', '2 min 5 s'."""
    if value is None or value == "":
        return "—"
    try:
        ms = float(value)
    except (TypeError, ValueError):
        return str(value)
    if ms < 1:
        return f"{ms:.2f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    minutes, seconds = divmod(ms / 1000, 60)
    return f"{int(minutes)} min {seconds:.0f} s"


@register.filter
def percent(value: Any, digits: int = 1) -> str:
    """A ratio 0..1 as '12.5%'; None (no calls) as '—'."""
    if value is None or value == "":
        return "—"
    try:
        return f"{float(value) * 100:.{int(digits)}f}%"
    except (TypeError, ValueError):
        return str(value)


@register.filter
def filesize(value: Any) -> str:
    """Bytes in binary units: '512 B', '1.5 KiB', '3.2 MiB'."""
    try:
        size = float(value)
    except (TypeError, ValueError):
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover - the loop always returns


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON text (non-ASCII kept readable); still escaped by the template."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


@register.filter
def as_json(value: Any) -> str:
    """An attribute value as JSON (true, ["x"], "text"), never a Python repr; still
    escaped by the template."""
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


@register.filter
def span_kind(value: Any) -> str:
    """The OTLP SpanKind number as its name."""
    from ..selectors.traces import kind_name

    return kind_name(value)


@register.filter
def clamp_pct(value: Any) -> int:
    """A number as a whole percent 0..100, for the o-N / w-N bar classes."""
    try:
        return max(0, min(100, int(round(float(value)))))
    except (TypeError, ValueError):
        return 0


@register.filter
def elapsed_ms(start: Any, end: Any) -> Any:
    """Milliseconds from start to end (datetimes), or None when either is missing."""
    try:
        return (end - start).total_seconds() * 1000.0
    except TypeError:
        return None


@register.filter
def mean(value: Any) -> str:
    """A mean with one decimal ('12.5'); None (nothing to average) as '—'."""
    if value is None or value == "":
        return "—"
    try:
        return f"{float(value):,.1f}"
    except (TypeError, ValueError):
        return str(value)


@register.filter
def usd(pico: Any) -> str:
    """pico-USD as dollars: '$12.35', '$0.0123', '$0.000045'; None as 'no price'
    (a model the price table does not know is never shown as $0)."""
    from dashboard.web.costs import usd_text

    return usd_text(pico)


@register.inclusion_tag("web/partials/cost.html")
def cost(pico: Any, left_out: Any = 0, noun: str = "round", testid: str = "", unknown: Any = 0) -> dict[str, Any]:
    """An amount with what it left out: '$1.20 (3 calls without a price left out)',
    'no price (3 rounds)' when nothing had a price, '$1.20' when everything had one;
    ``unknown``: the calls whose tokens are unknown, left out too ('$1.20 (2 calls
    with unknown tokens left out)', 'unknown (2 calls with unknown tokens)')."""
    return {"cost": pico, "left_out": int(left_out or 0), "noun": noun, "testid": testid,
            "unknown": int(unknown or 0)}


@register.filter
def round_number(index: Any) -> Any:
    """A round's number as people count it (from 1; the stored index counts from 0)."""
    from ..selectors.timeline import round_number as number

    return number(index)


@register.filter
def signed(value: Any) -> str:
    """A delta with its sign: '+12', '−3', '0'; None as '—'."""
    if value is None or value == "":
        return "—"
    number = int(value)
    return f"+{number:,}" if number > 0 else f"−{-number:,}" if number < 0 else "0"


@register.filter
def signed_usd(pico: Any) -> str:
    from dashboard.web.costs import usd_text

    if pico is None:
        return "—"
    text = usd_text(abs(int(pico)))
    return f"+{text}" if pico > 0 else f"−{text}" if pico < 0 else text


@register.filter
def signed_duration(ms: Any) -> str:
    if ms is None:
        return "—"
    text = duration(abs(ms))
    return f"+{text}" if ms > 0 else f"−{text}" if ms < 0 else text
