"""Query-string forms of the pages: parse and bound what the URL says."""

from __future__ import annotations

from datetime import datetime, time, timedelta, timezone

from django import forms

CONVERSATION_SORTS = {
    "-last_activity_at": "Latest activity first",
    "last_activity_at": "Oldest activity first",
    "-started_at": "Newest started first",
    "started_at": "Oldest started first",
}

# Time ranges offered on the overview and tools pages: label -> hours.
RANGES = {"1h": 1, "24h": 24, "7d": 24 * 7, "30d": 24 * 30, "90d": 24 * 90}
DEFAULT_RANGE = "7d"


class ConversationFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="Search text")
    user = forms.CharField(required=False, max_length=200)
    model = forms.CharField(required=False, max_length=200)
    status = forms.ChoiceField(
        required=False, choices=[("", "any"), ("ok", "ok"), ("error", "error")]
    )
    has_errors = forms.BooleanField(required=False, label="Has errors")
    tool = forms.CharField(required=False, max_length=200)
    since = forms.DateField(required=False, label="Started from")
    until = forms.DateField(required=False, label="Started until")
    sort = forms.ChoiceField(required=False, choices=list(CONVERSATION_SORTS.items()))
    after = forms.CharField(required=False, max_length=64)
    before = forms.CharField(required=False, max_length=64)

    def clean(self) -> dict:
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and since > until:
            raise forms.ValidationError("'Started from' is after 'Started until'.")
        if data.get("after") and data.get("before"):
            raise forms.ValidationError("Use either 'after' or 'before', not both.")
        return data

    def since_datetime(self) -> datetime | None:
        day = self.cleaned_data.get("since")
        return datetime.combine(day, time.min, tzinfo=timezone.utc) if day else None

    def until_datetime(self) -> datetime | None:
        """Exclusive end: the whole 'until' day is included."""
        day = self.cleaned_data.get("until")
        return datetime.combine(day + timedelta(days=1), time.min, tzinfo=timezone.utc) if day else None


class RangeForm(forms.Form):
    range = forms.ChoiceField(required=False, choices=[(k, k) for k in RANGES])

    def hours(self) -> int:
        value = self.cleaned_data.get("range") if self.is_valid() else None
        return RANGES[value or DEFAULT_RANGE]

    def label(self) -> str:
        value = self.cleaned_data.get("range") if self.is_valid() else None
        return value or DEFAULT_RANGE
