"""The judging tests' people and projects: the page tests' own (a member, their
project, a stranger and theirs)."""

from tests.dashboard.web.conftest import client_in, member, other_project, project, stranger  # noqa: F401
