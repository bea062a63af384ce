"""The log-in page: Django's LoginView with the throttled form, answering 429 while
locked out."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpResponse

from .forms import ThrottledAuthenticationForm


class LoginView(auth_views.LoginView):
    authentication_form = ThrottledAuthenticationForm

    def form_invalid(self, form: Any) -> HttpResponse:
        response = super().form_invalid(form)
        if getattr(form, "throttled", False):
            response.status_code = 429
            response["Retry-After"] = str(getattr(self.request, "login_lockout_seconds", 60))
        return response
