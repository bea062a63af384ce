from __future__ import annotations

from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from dashboard.accounts.models import Project
from dashboard.observatory.selectors import artifacts_for_project, download_name, download_type

from ..access import project_page
from ..selectors.artifacts import PREVIEW_BYTES, artifact_list as list_artifacts, artifact_provenance, preview


@project_page
def artifact_list(request: HttpRequest, project: Project) -> HttpResponse:
    before = request.GET.get("before", "")
    try:
        before_id = int(before) if before else None
    except ValueError:
        raise Http404("bad page") from None
    rows, next_before = list_artifacts(project, before_id=before_id)
    return render(
        request,
        "web/artifacts.html",
        {"project": project, "nav_section": "artifacts", "artifacts": rows, "next_before": next_before,
         "is_first": before_id is None},
    )


@project_page
def artifact_detail(request: HttpRequest, project: Project, artifact_id: str) -> HttpResponse:
    artifact = get_object_or_404(artifacts_for_project(project).select_related("conversation"), artifact_id=artifact_id)
    try:
        shown = preview(artifact)
    except OSError:
        shown = None  # the row outlived its file (a purge in progress): say so, no path
    return render(
        request,
        "web/artifact.html",
        {"project": project, "nav_section": "artifacts", "artifact": artifact, "preview": shown,
         "preview_limit": PREVIEW_BYTES, "provenance": artifact_provenance(artifact)},
    )


@project_page
def artifact_download(request: HttpRequest, project: Project, artifact_id: str) -> FileResponse:
    """The bytes, streamed, as an attachment named after the artifact id."""
    artifact = get_object_or_404(artifacts_for_project(project), artifact_id=artifact_id)
    try:
        handle = artifact.file.open("rb")
    except OSError:
        raise Http404("artifact file missing") from None
    response = FileResponse(
        handle, as_attachment=True, filename=download_name(artifact), content_type=download_type(artifact)
    )
    response["X-Content-Type-Options"] = "nosniff"
    return response
