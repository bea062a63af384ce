"""Query-string forms of the pages: parse and bound what the URL says."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone
from typing import Any, Optional

from django import forms

from dashboard.judging.selectors import ScoreMatch

CONVERSATION_SORTS = {
    "-last_activity_at": "Latest activity first",
    "last_activity_at": "Oldest activity first",
    "-started_at": "Newest started first",
    "started_at": "Oldest started first",
}

# Time ranges offered on the overview and tools pages: label -> hours.
RANGES = {"1h": 1, "24h": 24, "7d": 24 * 7, "30d": 24 * 30, "90d": 24 * 90}
DEFAULT_RANGE = "7d"


class DayOrTimeField(forms.Field):
    """A UTC day (2025-01-31) or a UTC time to the minute (2025-01-31T13:00), as
    a chart bucket's link gives it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(required=False, **kwargs)

    def to_python(self, value: Any) -> Optional[date | datetime]:
        text = str(value or "").strip()
        if not text:
            return None
        if len(text) > 32:
            raise forms.ValidationError("Enter a day (2025-01-31) or a UTC time (2025-01-31T13:00).")
        try:
            if len(text) == 10:
                return date.fromisoformat(text)
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise forms.ValidationError("Enter a day (2025-01-31) or a UTC time (2025-01-31T13:00).") from None
        if moment.tzinfo is not None:
            moment = moment.astimezone(timezone.utc)
        return moment.replace(tzinfo=timezone.utc)


def start_of(value: Optional[date | datetime]) -> Optional[datetime]:
    """A day as its first instant (UTC); a time as itself."""
    if isinstance(value, datetime) or value is None:
        return value
    return datetime.combine(value, time.min, tzinfo=timezone.utc)


class ScoreFilterForm(forms.Form):
    """The lists' score filters: a score with this name, value range or label, or
    negative feedback, made in a time range (the scores summary's drill-down)."""

    score = forms.CharField(required=False, max_length=200, label="Score name")
    score_min = forms.FloatField(required=False, min_value=-1e15, max_value=1e15, label="Score at least")
    score_max = forms.FloatField(required=False, min_value=-1e15, max_value=1e15, label="Score at most")
    score_label = forms.CharField(required=False, max_length=200, label="Score label")
    negative = forms.BooleanField(required=False, label="Has negative feedback")
    scored_since = DayOrTimeField(label="Scored from")
    scored_until = DayOrTimeField(label="Scored until")

    def clean(self) -> dict:
        data = super().clean()
        low, high = data.get("score_min"), data.get("score_max")
        if low is not None and high is not None and low > high:
            raise forms.ValidationError("'Score at least' is above 'Score at most'.")
        return data

    def score_match(self) -> ScoreMatch:
        data = self.cleaned_data
        until = data.get("scored_until")
        if isinstance(until, date) and not isinstance(until, datetime):
            until = start_of(until + timedelta(days=1))
        return ScoreMatch(name=data["score"].strip(), min_value=data["score_min"], max_value=data["score_max"],
                          label=data["score_label"].strip(), negative=bool(data["negative"]),
                          since=start_of(data.get("scored_since")), until=until)


class ConversationFilterForm(ScoreFilterForm):
    q = forms.CharField(required=False, max_length=200, label="Search text",
                        widget=forms.TextInput(attrs={"data-search": "", "placeholder": "press / to search"}))
    all_text = forms.BooleanField(required=False, label="also system and tool text")
    user = forms.CharField(required=False, max_length=200)
    model = forms.CharField(required=False, max_length=200)
    status = forms.ChoiceField(
        required=False, choices=[("", "any"), ("ok", "ok"), ("error", "error")]
    )
    has_errors = forms.BooleanField(required=False, label="Has errors")
    tool = forms.CharField(required=False, max_length=200)
    # Relative: "the last 24h" as of when the filter is read (a page load, a queue's fill),
    # kept as given in saved views and review queues.
    within = forms.ChoiceField(required=False, label="Started in the last",
                               choices=[("", "any time"), *((key, key) for key in RANGES)])
    since = DayOrTimeField(label="Started from")
    until = DayOrTimeField(label="Started until")
    sort = forms.ChoiceField(required=False, choices=list(CONVERSATION_SORTS.items()))
    after = forms.CharField(required=False, max_length=64)
    before = forms.CharField(required=False, max_length=64)

    def clean(self) -> dict:
        data = super().clean()
        if self.since_datetime() and self.until_datetime() and self.since_datetime() >= self.until_datetime():
            raise forms.ValidationError("'Started from' is after 'Started until'.")
        if data.get("after") and data.get("before"):
            raise forms.ValidationError("Use either 'after' or 'before', not both.")
        return data

    def since_datetime(self, now: datetime | None = None) -> datetime | None:
        """The start: ``since``, or ``within`` back from ``now`` (the later of the two)."""
        since = start_of(self.cleaned_data.get("since"))
        within = self.cleaned_data.get("within")
        if not within:
            return since
        recent = (now or datetime.now(timezone.utc)) - timedelta(hours=RANGES[within])
        return recent if since is None else max(since, recent)

    def described(self) -> list[str]:
        """The filters given, in words, as the user gave them (a relative start stays
        relative): what a review queue shows of how it was filled."""
        data, words = self.cleaned_data, []
        for name, field in self.fields.items():
            value = data.get(name)
            if name in ("after", "before", "sort") or value in (None, "", False):
                continue
            label = str(field.label or name).lower()
            if name == "within":
                words.append(f"started in the last {value}")
            elif isinstance(field, forms.BooleanField):
                words.append(label)
            elif isinstance(field, forms.ChoiceField):
                words.append(f"{label}: {dict(field.choices).get(value, value)}")
            else:
                shown = value.strftime("%Y-%m-%d %H:%M UTC") if isinstance(value, datetime) else value
                words.append(f"{label}: {shown}")
        return words

    def until_datetime(self) -> datetime | None:
        """Exclusive end: a day means the whole day; a time is the end itself."""
        value = self.cleaned_data.get("until")
        if isinstance(value, date) and not isinstance(value, datetime):
            return start_of(value + timedelta(days=1))
        return value


class RangeForm(forms.Form):
    range = forms.ChoiceField(required=False, choices=[(k, k) for k in RANGES])

    def hours(self) -> int:
        value = self.cleaned_data.get("range") if self.is_valid() else None
        return RANGES[value or DEFAULT_RANGE]

    def label(self) -> str:
        value = self.cleaned_data.get("range") if self.is_valid() else None
        return value or DEFAULT_RANGE


class TraceFilterForm(ScoreFilterForm):
    """The trace list's filters (on each trace's root span) and its cursor."""

    q = forms.CharField(required=False, max_length=200, label="Span name",
                        widget=forms.TextInput(attrs={"data-search": "", "placeholder": "text in a span name"}))
    service = forms.CharField(required=False, max_length=200)
    status = forms.ChoiceField(required=False, choices=[("", "any"), ("error", "error"), ("ok", "ok"),
                                                        ("unset", "unset")])
    has_errors = forms.BooleanField(required=False, label="Has errors")
    min_ms = forms.FloatField(required=False, min_value=0, max_value=1e12, label="Longer than (ms)")
    max_ms = forms.FloatField(required=False, min_value=0, max_value=1e12, label="Shorter than (ms)")
    since = DayOrTimeField(label="Started from")
    until = DayOrTimeField(label="Started until")
    conversation = forms.IntegerField(required=False, min_value=1, max_value=2**62, widget=forms.HiddenInput)
    after = forms.CharField(required=False, max_length=64)
    before = forms.CharField(required=False, max_length=64)

    since_datetime = ConversationFilterForm.since_datetime
    until_datetime = ConversationFilterForm.until_datetime

    def clean(self) -> dict:
        data = super().clean()
        if self.since_datetime() and self.until_datetime() and self.since_datetime() >= self.until_datetime():
            raise forms.ValidationError("'Started from' is after 'Started until'.")
        if data.get("min_ms") is not None and data.get("max_ms") is not None and data["min_ms"] >= data["max_ms"]:
            raise forms.ValidationError("'Longer than' is not below 'Shorter than'.")
        if data.get("after") and data.get("before"):
            raise forms.ValidationError("Use either 'after' or 'before', not both.")
        return data
