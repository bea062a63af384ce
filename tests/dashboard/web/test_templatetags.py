"""The formatting filters: plain text out, never a crash on odd input."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.template import Context, Template

from dashboard.web.templatetags import observatory as f


@pytest.mark.parametrize("value, expected", [(12345, "12,345"), (None, "—"), ("", "—"), ("abc", "abc"), (0, "0")])
def test_it_formats_tokens(value, expected):
    assert f.tokens(value) == expected


@pytest.mark.parametrize(
    "value, expected",
    [(0.5, "0.50 ms"), (850, "850 ms"), (1250, "1.25 s"), (125_000, "2 min 5 s"), (None, "—"), ("x", "x")],
)
def test_it_formats_durations(value, expected):
    assert f.duration(value) == expected


@pytest.mark.parametrize("value, expected", [(0.125, "12.5%"), (None, "—"), (1, "100.0%"), ("bad", "bad")])
def test_it_formats_percent(value, expected):
    assert f.percent(value) == expected


@pytest.mark.parametrize("value, expected", [(512, "512 B"), (1536, "1.5 KiB"), (5 * 1024**3, "5.0 GiB"), ("x", "—")])
def test_it_formats_file_sizes(value, expected):
    assert f.filesize(value) == expected


@pytest.mark.parametrize("value, expected", [(-5, 0), (49.6, 50), (250, 100), ("nan?", 0), (None, 0)])
def test_it_clamps_bar_percentages(value, expected):
    assert f.clamp_pct(value) == expected


def test_it_measures_elapsed_time():
    start = datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert f.elapsed_ms(start, start + timedelta(seconds=2)) == 2000.0
    assert f.elapsed_ms(None, start) is None


def test_it_keeps_output_escaped():
    template = Template("{% load observatory %}{{ v|pretty_json }}|{{ n|tokens }}|{{ m|mean }}")
    out = template.render(Context({"v": {"k": "<script>x()</script>", "zh": "东部"}, "n": "<b>", "m": None}))
    assert "<script>" not in out and "&lt;script&gt;" in out and "东部" in out
    assert "&lt;b&gt;" in out and out.endswith("|—")



@pytest.mark.parametrize("value", [
    "short", "x" * 80, "x" * 81, "Question 12 about sales in region 5" * 4, "e\u0301" * 50, "e\u0301" * 5, "", None, 12345,
    "<script>alert(1)</script>" * 5,
])
@pytest.mark.parametrize("length", [80, "80", 1, 0, "junk"])
def test_it_clips_text_as_truncatechars_does(value, length):
    clip = Template("{% load observatory %}{{ v|clip:n }}")
    truncate = Template("{{ v|truncatechars:n }}")
    context = {"v": value, "n": length}
    assert clip.render(Context(context)) == truncate.render(Context(context))
