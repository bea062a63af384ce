"""Security headers the pages rely on.

Observations, messages and span attributes are written by agents and hold whatever a
tool returned, HTML and script included. Templates escape them; the
Content-Security-Policy is the second wall: no inline script, no eval, no inline
style, nothing from another origin. Charts read their data from ``json_script``
blocks and are drawn by static JS, so the policy costs the pages nothing.
"""

from __future__ import annotations

from typing import Callable

from django.http import HttpRequest, HttpResponse

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class SecurityHeadersMiddleware:
    """Adds the Content-Security-Policy and a strict Referrer-Policy to every response
    that does not set its own (X-Frame-Options comes from Django's clickjacking
    middleware)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response
