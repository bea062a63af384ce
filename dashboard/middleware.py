"""Middleware for every view, pages and API alike."""

from __future__ import annotations

import functools
from typing import Callable
from urllib.parse import unquote

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.urls import ResolverMatch, resolve


class RejectNulBytesMiddleware:
    """A NUL byte in the path or the query string is never meaningful, and PostgreSQL
    refuses it in any text comparison (a 500 deep inside a query). Answer 400 at the
    door instead, for every view at once. Bodies are the parsers' business: form fields
    refuse NUL (Django's validator) and the ingest parsers replace it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path_info or "\x00" in unquote(request.META.get("QUERY_STRING", "")):
            return HttpResponseBadRequest("NUL byte in the URL\n", content_type="text/plain")
        return self.get_response(request)


class IngestFastPathMiddleware:
    """Agents' endpoints skip the pages' middleware.

    Ingest requests carry an API key, never a session cookie or a form, and answer
    protobuf or JSON, so sessions, CSRF, users, messages, static files and the pages'
    security headers have nothing to do there; together they cost about a quarter
    of a millisecond a request, a sixth of storing a 10-span batch. Placed after
    SecurityMiddleware (HTTPS redirect, HSTS, nosniff) and the NUL check, which
    still apply. The views authenticate with the key themselves and are
    CSRF-exempt; an unknown path under a prefix is a plain 404.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.prefixes = tuple(settings.OBSERVATORY_INGEST_PATH_PREFIXES)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path_info.startswith(self.prefixes):
            return self.get_response(request)
        match = _resolve_ingest(request.path_info, settings.ROOT_URLCONF)
        request.resolver_match = match
        return match.func(request, *match.args, **match.kwargs)


@functools.lru_cache(maxsize=256)
def _resolve_ingest(path: str, urlconf: str) -> ResolverMatch:
    """``resolve`` remembered per path: walking the URL patterns cost about a tenth
    of a small batch's time, and agents post to the same few paths over and over
    (bounded, so paths made up by a client only push out others; a 404 is not kept)."""
    return resolve(path, urlconf)
