"""What a score may be under its config, what a config may say, what is negative."""

from __future__ import annotations

import pytest

from dashboard.judging.rules import ConfigRules, ScoreKind, config_problems, is_negative, kind_of, score_refusal

STARS = ConfigRules("helpfulness", ScoreKind.NUMERIC, 1, 5)
VERDICT = ConfigRules("verdict", ScoreKind.CATEGORICAL, labels=("good", "meh", "bad"), negative_labels=("bad",))
THUMBS = ConfigRules("thumbs", ScoreKind.BOOLEAN)


@pytest.mark.parametrize("config, value, label", [
    (None, 7.5, None), (None, None, "anything"), (STARS, 1, None), (STARS, 5.0, None), (STARS, 3, "ok"),
    (VERDICT, None, "meh"), (VERDICT, 0.3, "good"), (THUMBS, True, None), (THUMBS, 0, None),
])
def test_it_takes_a_score_within_its_config(config, value, label):
    assert score_refusal(config, value, label) is None


@pytest.mark.parametrize("config, value, label, words", [
    (STARS, 7, None, "helpfulness must be within 1..5; got 7"),
    (STARS, 0.5, None, "within 1..5"),
    (STARS, None, "great", "numeric score: send a number"),
    (STARS, True, None, "numeric score"),
    (VERDICT, None, "awful", "verdict has no label 'awful'; its labels are 'good', 'meh', 'bad'"),
    (VERDICT, 3, None, "categorical score: send one of its labels"),
    (THUMBS, 0.5, None, "thumbs is a boolean score"),
    (THUMBS, None, "yes", "boolean score"),
])
def test_it_refuses_a_score_outside_its_config_saying_why(config, value, label, words):
    assert words in score_refusal(config, value, label)


def test_it_says_an_open_range_in_words():
    assert "within >= 0" in score_refusal(ConfigRules("latency", ScoreKind.NUMERIC, 0, None), -1, None)
    assert "within <= 1" in score_refusal(ConfigRules("p", ScoreKind.NUMERIC, None, 1), 2, None)


@pytest.mark.parametrize("values, problem", [
    (dict(kind="numeric", min_value=5, max_value=1, labels=[], negative_labels=[]), "max_value"),
    (dict(kind="boolean", min_value=0, max_value=None, labels=[], negative_labels=[]), "min_value"),
    (dict(kind="categorical", min_value=None, max_value=None, labels=[], negative_labels=[]), "labels"),
    (dict(kind="categorical", min_value=None, max_value=None, labels=["a"], negative_labels=["b"]), "negative_labels"),
    (dict(kind="categorical", min_value=None, max_value=None, labels=["a", "a"], negative_labels=[]), "labels"),
    (dict(kind="categorical", min_value=None, max_value=None, labels="a,b", negative_labels=[]), "labels"),
    (dict(kind="categorical", min_value=None, max_value=None, labels=["x" * 201], negative_labels=[]), "labels"),
    (dict(kind="numeric", min_value=None, max_value=None, labels=["a"], negative_labels=[]), "labels"),
    (dict(kind="stars", min_value=None, max_value=None, labels=[], negative_labels=[]), "kind"),
])
def test_it_finds_what_is_wrong_with_a_config(values, problem):
    assert problem in config_problems(**values)


def test_it_finds_nothing_wrong_with_sound_configs():
    assert config_problems(kind="numeric", min_value=1, max_value=5, labels=[], negative_labels=[]) == {}
    assert config_problems(kind="categorical", min_value=None, max_value=None, labels=["a", "b"],
                           negative_labels=["b"]) == {}
    assert config_problems(kind="boolean", min_value=None, max_value=None, labels=[], negative_labels=[]) == {}


def test_it_reads_the_kind_from_the_value_without_a_config():
    assert [kind_of(True, None), kind_of(3, None), kind_of(0.5, "x"), kind_of(None, "x")] == [
        "boolean", "numeric", "numeric", "categorical"]


def test_it_calls_false_low_and_negative_labels_negative():
    assert is_negative(None, ScoreKind.BOOLEAN, 0.0, "") and not is_negative(None, ScoreKind.BOOLEAN, 1.0, "")
    assert is_negative(STARS, ScoreKind.NUMERIC, 2.9, "") and not is_negative(STARS, ScoreKind.NUMERIC, 3, "")
    assert is_negative(VERDICT, ScoreKind.CATEGORICAL, None, "bad")
    assert not is_negative(VERDICT, ScoreKind.CATEGORICAL, None, "meh")
    assert not is_negative(None, ScoreKind.NUMERIC, -100, "")  # no config: no range to be low in
