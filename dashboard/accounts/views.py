"""The log-in pages: the dashboard's (Django's LoginView with the throttled form) and
the admin's, both answering 429 with Retry-After while the throttle locks the
account or the address out, through one function."""

from __future__ import annotations

import functools
from typing import Any, Callable

from django.contrib.admin import AdminSite
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse

from .forms import ThrottledAdminAuthenticationForm, ThrottledAuthenticationForm


def lockout_answer(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """The log-in form shown again because the throttle refused the attempt (the
    backend leaves the lockout's length on the request): 429 with Retry-After."""
    seconds = getattr(request, "login_lockout_seconds", 0)
    if seconds and response.status_code == 200:
        response.status_code = 429
        response["Retry-After"] = str(seconds)
    return response


class LoginView(auth_views.LoginView):
    authentication_form = ThrottledAuthenticationForm

    def form_invalid(self, form: Any) -> HttpResponse:
        return lockout_answer(self.request, super().form_invalid(form))


def admin_login_throttled(site: AdminSite) -> None:
    """The admin's log-in through the same throttle and answer as the pages': its
    form says why, its answer is 429. Call before ``site.urls`` is read."""
    site.login_form = ThrottledAdminAuthenticationForm
    login: Callable[..., HttpResponse] = site.login

    @functools.wraps(login)
    def throttled_login(request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        return lockout_answer(request, login(request, extra_context))

    site.login = throttled_login  # type: ignore[method-assign]
