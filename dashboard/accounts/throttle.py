"""Log-in throttling: too many failed log-ins for one account, or from one client
address, within a window lock that account / address out for a while, even for the
right password. Counted in the database (``LoginThrottle``) so all web workers agree.

The authentication backend calls these; the log-in forms turn a lockout into a clear
message (and the log-in page answers 429).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone

from .models import LoginThrottle

KEY_LENGTH = 255


def client_address(request: HttpRequest | None) -> str:
    """The client's address: REMOTE_ADDR, or the header a trusted proxy sets
    (``OBSERVATORY_CLIENT_IP_HEADER``, e.g. X-Real-IP) when one is configured."""
    if request is None:
        return ""
    header = settings.OBSERVATORY_CLIENT_IP_HEADER
    if header:
        value = request.headers.get(header, "").split(",")[0].strip()
        if value:
            return value[:KEY_LENGTH]
    return str(request.META.get("REMOTE_ADDR", ""))[:KEY_LENGTH]


def _keys(username: str, address: str) -> list[tuple[str, str, int]]:
    """(scope, key, allowed failures) of what one attempt counts against."""
    keys = []
    if username:
        keys.append((LoginThrottle.Scope.ACCOUNT, username.strip().lower()[:KEY_LENGTH],
                     settings.OBSERVATORY_LOGIN_MAX_FAILURES_PER_ACCOUNT))
    if address:
        keys.append((LoginThrottle.Scope.ADDRESS, address, settings.OBSERVATORY_LOGIN_MAX_FAILURES_PER_ADDRESS))
    return keys


def _matching(keys: list[tuple[str, str, int]]) -> Q:
    query = Q(pk__in=[])
    for scope, key, _ in keys:
        query |= Q(scope=scope, key=key)
    return query


def login_lockout_remaining(*, username: str, address: str) -> int:
    """Seconds until this account or address may try again; 0 when not locked out."""
    keys = _keys(username, address)
    if not keys:
        return 0
    now = timezone.now()
    until = (
        LoginThrottle.objects.filter(_matching(keys), locked_until__gt=now)
        .order_by("-locked_until").values_list("locked_until", flat=True).first()
    )
    return 0 if until is None else max(int((until - now).total_seconds()) + 1, 1)


def login_failure_record(*, username: str, address: str) -> None:
    """Count a failed log-in against the account and the address; lock out whichever
    passed its allowance within the window."""
    now = timezone.now()
    window = timedelta(seconds=settings.OBSERVATORY_LOGIN_LOCKOUT_SECONDS)
    with transaction.atomic():
        for scope, key, allowed in _keys(username, address):
            row, _ = LoginThrottle.objects.select_for_update().get_or_create(scope=scope, key=key)
            if now - row.window_started_at > window:
                row.failures, row.window_started_at = 0, now
            row.failures += 1
            if row.failures >= allowed:
                row.locked_until = now + window
                row.failures, row.window_started_at = 0, now
            row.save()


def login_success_record(*, username: str) -> None:
    """A right password (not locked out) clears the account's count, not the address's."""
    if username:
        LoginThrottle.objects.filter(
            scope=LoginThrottle.Scope.ACCOUNT, key=username.strip().lower()[:KEY_LENGTH]
        ).delete()


def login_throttle_purge(*, now=None) -> int:
    """Rows whose window and lockout are both over (called by the daily purge)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.OBSERVATORY_LOGIN_LOCKOUT_SECONDS)
    deleted, _ = LoginThrottle.objects.filter(
        Q(locked_until__isnull=True) | Q(locked_until__lt=now), window_started_at__lt=cutoff
    ).delete()
    return deleted
