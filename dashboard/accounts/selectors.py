"""Reads for projects: what a user may see."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet
from django.http import Http404

from .models import ApiKey, Project


def projects_for_user(user: AbstractBaseUser | AnonymousUser) -> QuerySet[Project]:
    """The projects a user belongs to (none when anonymous or inactive). Views get
    a project through this so a project the user is not in is a 404, never a 403
    that would confirm it exists."""
    if not user.is_authenticated or not user.is_active:
        return Project.objects.none()
    return Project.objects.filter(memberships__user=user).distinct()


def project_for_user(user: AbstractBaseUser | AnonymousUser, slug: str) -> Project:
    project = projects_for_user(user).filter(slug=slug).first()
    if project is None:
        raise Http404("no such project")
    return project


def apikeys_for_project(project: Project) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(project=project).order_by("-created_at")
