"""Datasets from production: add a conversation or a round (from the timeline), or
every conversation of a filtered list, to a named dataset; list its items with their
source links and edit each one's expected output; export it as JSON Lines (streamed)
and import JSON Lines (all or nothing). Another project's dataset or item is a 404;
viewers read but do not change datasets.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard.accounts.models import Project
from dashboard.judging.models import Dataset, DatasetItem
from dashboard.judging.selectors import cases_of_conversations, cases_of_rounds, dataset_lines
from dashboard.judging.services import (
    MAX_DATASET_ADD,
    DatasetRefused,
    dataset_add_cases,
    dataset_create,
    dataset_import,
    dataset_item_delete,
    dataset_item_expect,
    dataset_lines_parse,
)
from dashboard.observatory.models import Conversation, Round

from ..access import project_page
from ..forms import ConversationFilterForm
from .conversations import filtered_conversations
from .scores import may_judge, named_create, require_judge

PAGE_SIZE = 50
MAX_IMPORT_ITEMS = 10_000


class DatasetForm(forms.Form):
    name = forms.RegexField(regex=r"^[^\x00-\x1f\x7f/]{1,100}$", max_length=100, strip=True,
                            error_messages={"invalid": "1 to 100 characters, no slashes."})
    description = forms.CharField(max_length=2000, required=False)


class AddForm(forms.Form):
    """What to add (a conversation, a round, or the list for ``query``) to which dataset
    (an existing one, or a new one by name)."""

    target = forms.ChoiceField(choices=[("conversation", "conversation"), ("round", "round"), ("list", "list")])
    object = forms.IntegerField(required=False, min_value=1, max_value=2**62)
    query = forms.CharField(required=False, max_length=2000, strip=False)
    dataset = forms.IntegerField(required=False, min_value=1, max_value=2**62)
    new_name = forms.RegexField(required=False, regex=r"^[^\x00-\x1f\x7f/]{1,100}$", max_length=100, strip=True)

    def clean(self) -> dict:
        data = super().clean()
        if not data.get("dataset") and not data.get("new_name"):
            raise forms.ValidationError("Choose a dataset or name a new one.")
        if data.get("target") in ("conversation", "round") and not data.get("object"):
            raise forms.ValidationError("Name what to add.")
        return data


def _dataset(project: Project, pk: int) -> Dataset:
    return get_object_or_404(Dataset, project=project, pk=pk)


@project_page
def dataset_list(request: HttpRequest, project: Project) -> HttpResponse:
    def create(data: dict) -> HttpResponse:
        dataset = dataset_create(project=project, name=data["name"], user=request.user,
                                 description=data["description"])
        return redirect("web:dataset", project_slug=project.slug, pk=dataset.pk)

    form, status, made = named_create(request, project, DatasetForm, create, DatasetRefused)
    if made is not None:
        return made
    datasets = list(Dataset.objects.filter(project=project).order_by("name")[:200])
    counts = dict(DatasetItem.objects.filter(dataset__in=datasets).values("dataset_id").order_by()
                  .annotate(n=Count("id")).values_list("dataset_id", "n"))
    for dataset in datasets:
        dataset.item_count = counts.get(dataset.pk, 0)
    return render(request, "web/datasets.html", {
        "project": project, "nav_section": "datasets", "datasets": datasets, "form": form,
        "may_change": may_judge(request.user, project),
    }, status=status)


@project_page
def dataset_detail(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    dataset = _dataset(project, pk)
    after = request.GET.get("after", "")
    items = DatasetItem.objects.filter(dataset=dataset).order_by("id").select_related(
        "source_conversation", "source_round")
    if after.isdigit() and len(after) <= 18:
        items = items.filter(id__gt=int(after))
    page = list(items[:PAGE_SIZE + 1])
    more = len(page) > PAGE_SIZE
    page = page[:PAGE_SIZE]
    for item in page:
        item.expected_text = _shown(item.expected_output)
    return render(request, "web/dataset.html", {
        "project": project, "nav_section": "datasets", "dataset": dataset, "items": page,
        "next_after": page[-1].pk if more else None, "total": DatasetItem.objects.filter(dataset=dataset).count(),
        "may_change": may_judge(request.user, project), "first_page": not after,
    })


def _shown(value: Any) -> str:
    """An expected output as the form shows it: text as itself, anything else as JSON."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)


class ExpectedForm(forms.Form):
    expected = forms.CharField(required=False, max_length=100_000, strip=False, widget=forms.Textarea)

    def expected_value(self) -> Any:
        """JSON when the text is JSON (an object, a list, a number), else the text; empty: none."""
        text = self.cleaned_data["expected"]
        if not text.strip():
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return text
        return value if isinstance(value, (dict, list, int, float, bool)) else text


@require_POST
@project_page
def dataset_item_edit(request: HttpRequest, project: Project, pk: int, item_pk: int) -> HttpResponse:
    require_judge(request, project)
    dataset = _dataset(project, pk)
    item = get_object_or_404(DatasetItem, dataset=dataset, pk=item_pk)
    form = ExpectedForm(request.POST)
    if not form.is_valid():
        messages.error(request, "The expected output is too long.")
    else:
        dataset_item_expect(item=item, expected=form.expected_value())
        messages.success(request, "Saved the expected output.")
    return redirect(reverse("web:dataset", args=[project.slug, dataset.pk]) + f"#item-{item.pk}")


@require_POST
@project_page
def dataset_item_remove(request: HttpRequest, project: Project, pk: int, item_pk: int) -> HttpResponse:
    require_judge(request, project)
    dataset = _dataset(project, pk)
    dataset_item_delete(item=get_object_or_404(DatasetItem, dataset=dataset, pk=item_pk))
    return redirect("web:dataset", project_slug=project.slug, pk=dataset.pk)


@project_page
def dataset_export(request: HttpRequest, project: Project, pk: int) -> StreamingHttpResponse:
    dataset = _dataset(project, pk)
    response = StreamingHttpResponse(dataset_lines(dataset), content_type="application/x-ndjson; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="dataset-{dataset.pk}.jsonl"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


class ImportForm(forms.Form):
    file = forms.FileField()


@require_POST
@project_page
def dataset_import_file(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    require_judge(request, project)
    dataset = _dataset(project, pk)
    form = ImportForm(request.POST, request.FILES)
    back = redirect("web:dataset", project_slug=project.slug, pk=dataset.pk)
    if not form.is_valid():
        messages.error(request, "Choose a JSON Lines file to import.")
        return back
    upload = form.cleaned_data["file"]
    if upload.size > settings.OBSERVATORY_MAX_BODY_BYTES:
        messages.error(request, f"The file is larger than {settings.OBSERVATORY_MAX_BODY_BYTES} bytes.")
        return back
    try:
        items = dataset_lines_parse(upload.read(), limit=MAX_IMPORT_ITEMS)
    except DatasetRefused as exc:
        messages.error(request, str(exc))
        return back
    added, duplicates = dataset_import(dataset=dataset, items=items)
    messages.success(request, f"Imported {added} item{'s' if added != 1 else ''}"
                              + (f" ({duplicates} already there)" if duplicates else "") + ".")
    return back


@require_POST
@project_page
def dataset_add(request: HttpRequest, project: Project) -> HttpResponse:
    """Add a conversation, a round or a filtered list's conversations to a dataset."""
    require_judge(request, project)
    form = AddForm(request.POST)
    if not form.is_valid():
        problems = form.errors.get("__all__") or ["Name the dataset: 1 to 100 characters, no slashes."]
        messages.error(request, " ".join(problems))
        return redirect("web:datasets", project_slug=project.slug)
    data = form.cleaned_data
    if data["dataset"]:
        dataset = _dataset(project, data["dataset"])
    else:
        dataset = Dataset.objects.filter(project=project, name=data["new_name"]).first() or dataset_create(
            project=project, name=data["new_name"], user=request.user)
    if data["target"] == "round":
        round_ = get_object_or_404(Round, project=project, pk=data["object"])
        cases = cases_of_rounds([round_])
    elif data["target"] == "conversation":
        cases = cases_of_conversations([get_object_or_404(Conversation, project=project, pk=data["object"])])
    else:
        filters = ConversationFilterForm(QueryDict(data["query"]))
        if not filters.is_valid():
            messages.error(request, "These filters are not valid; fix them on the list first.")
            return redirect(reverse("web:conversations", args=[project.slug]))
        listed = list(filtered_conversations(filters, project).order_by("-last_activity_at", "-id")
                      .only("id", "external_id", "model", "status")[:MAX_DATASET_ADD])
        cases = cases_of_conversations(listed)
    added = dataset_add_cases(dataset=dataset, cases=cases)
    messages.success(request, f"Added {added} item{'s' if added != 1 else ''} to “{dataset.name}”"
                              + (f" ({len(cases) - added} already there)" if len(cases) > added else "") + ".")
    return redirect("web:dataset", project_slug=project.slug, pk=dataset.pk)
