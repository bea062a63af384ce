"""The authentication backend: Django's ModelBackend behind the log-in throttle."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from . import throttle


class ThrottledModelBackend(ModelBackend):
    """Refuses every attempt (the right password too) while the account or the client
    address is locked out, and counts failures. The lockout's length is left on
    ``request.login_lockout_seconds`` for the log-in form's message."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None,
                     password: str | None = None, **kwargs: Any) -> Any:
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        address = throttle.client_address(request)
        remaining = throttle.login_lockout_remaining(username=username, address=address)
        if remaining:
            if request is not None:
                request.login_lockout_seconds = remaining  # type: ignore[attr-defined]
            raise PermissionDenied("locked out")  # ends authentication: no other backend tries
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            throttle.login_failure_record(username=username, address=address)
            remaining = throttle.login_lockout_remaining(username=username, address=address)
            if remaining and request is not None:
                request.login_lockout_seconds = remaining  # type: ignore[attr-defined]
        else:
            throttle.login_success_record(username=username)
        return user
