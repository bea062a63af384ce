from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from dashboard.accounts.selectors import projects_for_user


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """Straight to the only project; a list when there are several or none."""
    projects = list(projects_for_user(request.user).only("id", "name", "slug")[:2])
    if len(projects) == 1:
        return redirect("web:overview", project_slug=projects[0].slug)
    return render(request, "web/home.html", {"projects": projects_for_user(request.user)})
