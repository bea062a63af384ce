"""API keys of a project: create (the key text is shown once, on the response to
the POST, and never stored), list, revoke. Owners only may change them."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from dashboard.accounts.models import Membership, Project
from dashboard.accounts.selectors import apikeys_for_project
from dashboard.accounts.services import apikey_create, apikey_revoke

from ..access import project_page


class KeyForm(forms.Form):
    name = forms.CharField(max_length=100, initial="default")


def _is_owner(request: HttpRequest, project: Project) -> bool:
    return request.user.is_superuser or Membership.objects.filter(
        project=project, user=request.user, role=Membership.Role.OWNER
    ).exists()


@project_page
def key_list(request: HttpRequest, project: Project) -> HttpResponse:
    owner = _is_owner(request, project)
    new_key_text = None
    form = KeyForm()
    if request.method == "POST":
        if not owner:
            raise Http404("not an owner")  # do not confirm what a non-owner may not do
        form = KeyForm(request.POST)
        if form.is_valid():
            _, new_key_text = apikey_create(project=project, name=form.cleaned_data["name"])
            form = KeyForm()
    response = render(
        request,
        "web/keys.html",
        {
            "project": project,
            "nav_section": "keys",
            "keys": apikeys_for_project(project)[:200],
            "form": form,
            "is_owner": owner,
            "new_key_text": new_key_text,
        },
        status=400 if form.errors else 200,
    )
    response["Cache-Control"] = "no-store"  # the new key's text must not be cached
    return response


@require_POST
@project_page
def key_revoke(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    if not _is_owner(request, project):
        raise Http404("not an owner")
    key = get_object_or_404(apikeys_for_project(project), pk=pk)
    apikey_revoke(key=key)
    messages.success(request, f"Key {key.prefix} ({key.name}) revoked.")
    return redirect("web:keys", project_slug=project.slug)
