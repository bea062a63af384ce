"""URL converters for the ids that appear in paths, shared by the pages and the API.

A malformed id (``../``, a path, NUL, upper-case hex) never reaches a view: the URL does
not match and the answer is 404. The artifact id form is the pipeline's own.
"""

from __future__ import annotations

from django.urls import register_converter

from pipeline import ARTIFACT_ID_PATTERN


class _IdConverter:
    regex = ""

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class ArtifactIdConverter(_IdConverter):
    regex = ARTIFACT_ID_PATTERN


class TraceIdConverter(_IdConverter):
    regex = "[0-9a-f]{32}"


# Imported by every urls module that uses them; a module runs once, so each name is
# registered once.
register_converter(ArtifactIdConverter, "artifact_id")
register_converter(TraceIdConverter, "trace_id")
