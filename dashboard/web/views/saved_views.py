"""Saved views: save the conversation list's filters under a name (POST, CSRF),
list the ones the user may open, open one (a redirect to the list with its
query string), delete one's own. Another project's view, or another member's
unshared one, is a 404."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard.accounts.models import Project

from ..access import project_page
from ..forms import ConversationFilterForm, TraceFilterForm
from ..models import SAVED_VIEW_PAGES, SavedView
from ..selectors.saved_views import saved_view_for, visible_views
from ..services import SavedViewError, saved_view_create, saved_view_delete, saved_view_query

# How each page's query string is checked before it is saved.
QUERY_FORMS = {"conversations": ConversationFilterForm, "traces": TraceFilterForm}


class SavedViewForm(forms.Form):
    name = forms.CharField(max_length=100, strip=True)
    page = forms.ChoiceField(choices=[(key, key) for key in SAVED_VIEW_PAGES])
    query = forms.CharField(max_length=2000, required=False, strip=False)
    shared = forms.BooleanField(required=False)

    def clean(self) -> dict:
        data = super().clean()
        page = data.get("page")
        if page in QUERY_FORMS:
            query = QueryDict(data.get("query", ""))
            if not QUERY_FORMS[page](query).is_valid():
                raise forms.ValidationError("These filters are not valid; fix them on the list first.")
            data["query"] = saved_view_query(query)
            if len(data["query"]) > SavedView._meta.get_field("query").max_length:  # re-encoding can lengthen it
                raise forms.ValidationError("These filters are too long to save.")
        return data


def view_url(project: Project, page: str, query: str) -> str:
    return reverse(SAVED_VIEW_PAGES[page], args=[project.slug]) + (f"?{query}" if query else "")


@project_page
def saved_view_list(request: HttpRequest, project: Project) -> HttpResponse:
    status = 200
    form = SavedViewForm()
    if request.method == "POST":
        form = SavedViewForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            try:
                view = saved_view_create(project=project, owner=request.user, page=data["page"], name=data["name"],
                                         query=data["query"], shared=data["shared"])
            except SavedViewError as exc:
                form.add_error("name", str(exc))
            else:
                messages.success(request, f"Saved the view “{view.name}”.")
                return redirect(view_url(project, view.page, view.query))
        status = 400
    views = list(visible_views(request.user, project).select_related("owner")[:200])
    for view in views:
        view.url = view_url(project, view.page, view.query)
    return render(request, "web/saved_views.html", {
        "project": project, "nav_section": "views", "views": views, "form": form,
    }, status=status)


@project_page
def saved_view_open(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    view = saved_view_for(request.user, project, pk)
    return redirect(view_url(project, view.page, view.query))


@require_POST
@project_page
def saved_view_remove(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    view = saved_view_for(request.user, project, pk)
    try:
        saved_view_delete(view=view, user=request.user)
    except SavedViewError:
        raise Http404("not the owner") from None  # do not confirm what a non-owner may not do
    messages.success(request, f"Deleted the view “{view.name}”.")
    return redirect("web:saved_views", project_slug=project.slug)
