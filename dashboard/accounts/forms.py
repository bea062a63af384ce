"""Log-in forms that say so when the throttle refused the attempt."""

from __future__ import annotations

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm


class _LockoutMessage:
    request: object

    def clean(self) -> dict:
        try:
            return super().clean()  # type: ignore[misc]
        except forms.ValidationError:
            seconds = getattr(self.request, "login_lockout_seconds", 0)
            if seconds:
                minutes = max(1, -(-seconds // 60))
                raise forms.ValidationError(
                    f"Too many failed log-ins for this account or from your address. "
                    f"Try again in {minutes} minute{'s' if minutes != 1 else ''}.",
                    code="throttled",
                ) from None
            raise

    @property
    def throttled(self) -> bool:
        return bool(getattr(self.request, "login_lockout_seconds", 0))


class ThrottledAuthenticationForm(_LockoutMessage, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(_LockoutMessage, AdminAuthenticationForm):
    pass
