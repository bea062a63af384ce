from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from dashboard.accounts.models import Project
from dashboard.observatory.models import ToolExecution

from ..access import project_page
from ..selectors.tools import level_costs
from .ranges import chosen_range


@project_page
def level_comparison(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    """One tool execution at BRIEF, STANDARD and FULL side by side, and what each
    level would have cost across the tool's calls in the range."""
    execution = get_object_or_404(
        ToolExecution.objects.select_related("conversation"), project=project, pk=pk
    )
    window = chosen_range(request)
    columns = [
        {
            "level": level,
            "observation": getattr(execution, f"{level}_observation"),
            "tokens": getattr(execution, f"{level}_tokens"),
            "seen": execution.output_level == level,
        }
        for level in ("brief", "standard", "full")
    ]
    return render(
        request,
        "web/levels.html",
        {
            "project": project,
            "nav_section": "tools",
            "execution": execution,
            "columns": columns,
            "range": window.label,
            "costs": level_costs(project, execution.tool_name, since=window.since),
        },
    )
