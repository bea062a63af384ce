"""Who may see what: every page lives under /p/<slug>/ and resolves the project
from the user's memberships, so another project's page or object is a 404 (we do
not confirm that it exists)."""

from __future__ import annotations

from functools import wraps
from typing import Any, Callable

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404

from dashboard.accounts.models import Project
from dashboard.accounts.selectors import projects_for_user

ProjectView = Callable[..., HttpResponse]


def project_page(view: ProjectView) -> Callable[..., HttpResponse]:
    """Login required, then the project named in the URL among the user's own
    projects (404 otherwise); the view gets it as its second argument."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, project_slug: str, *args: Any, **kwargs: Any) -> HttpResponse:
        project: Project = get_object_or_404(projects_for_user(request.user), slug=project_slug)
        request.project = project  # type: ignore[attr-defined]  # read by the context processor
        return view(request, project, *args, **kwargs)

    return wrapper
