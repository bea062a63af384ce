"""Projects, members and API keys.

An API key is ``po_<prefix>_<secret>``: the prefix (public, indexed) finds the row,
the sha256 of the whole key is compared in constant time. The secret is 32 random
bytes, so the key cannot be guessed or brute-forced from its hash and a fast hash is
the right one (a slow password hash would only make every ingest request slower).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Project(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        MEMBER = "member", "Member"
        VIEWER = "viewer", "Viewer"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "project"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class ApiKey(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, default="default")
    prefix = models.CharField(max_length=16, unique=True)
    hash = models.CharField(max_length=64)  # sha256 hex of the whole key text
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"po_{self.prefix}_… ({self.name})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None


class LoginThrottle(models.Model):
    """Failed log-ins counted per account and per client address (one row each).

    In the database rather than a per-process cache, so every web worker sees the
    same count and a restart does not reset a lockout.
    """

    class Scope(models.TextChoices):
        ACCOUNT = "account", "Account"
        ADDRESS = "address", "Address"

    scope = models.CharField(max_length=8, choices=Scope.choices)
    key = models.CharField(max_length=255)  # a lower-cased username or a client address
    failures = models.PositiveIntegerField(default=0)
    window_started_at = models.DateTimeField(default=timezone.now)
    locked_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "key"], name="login_throttle_unique")]

    def __str__(self) -> str:
        return f"{self.scope} {self.key}: {self.failures}"
