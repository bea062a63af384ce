"""Middleware for every view, pages and API alike."""

from __future__ import annotations

from typing import Callable
from urllib.parse import unquote

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest


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
