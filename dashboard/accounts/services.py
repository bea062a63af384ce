"""Writes for projects, members and keys."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from .keys import hash_key, new_key_text, new_prefix
from .models import ApiKey, Membership, Project


@transaction.atomic
def project_create(*, name: str, slug: str = "", owner: AbstractBaseUser | None = None) -> Project:
    """A project (slug from the name when not given, made unique) with an optional owner."""
    name = name.strip()
    if not name:
        raise ValueError("a project needs a name")
    base = slugify(slug or name)[:90] or "project"
    candidate, n = base, 1
    while Project.objects.filter(slug=candidate).exists():
        n += 1
        candidate = f"{base}-{n}"
    project = Project.objects.create(name=name[:200], slug=candidate)
    if owner is not None:
        Membership.objects.create(user=owner, project=project, role=Membership.Role.OWNER)
    return project


def membership_add(*, project: Project, user: AbstractBaseUser, role: str = Membership.Role.MEMBER) -> Membership:
    membership, _ = Membership.objects.update_or_create(user=user, project=project, defaults={"role": role})
    return membership


def apikey_create(*, project: Project, name: str = "default") -> tuple[ApiKey, str]:
    """A new key and its text ``po_<prefix>_<secret>``, which is shown this once:
    only its sha256 is stored. The secret is 32 random bytes."""
    while True:
        prefix = new_prefix()
        if not ApiKey.objects.filter(prefix=prefix).exists():
            break
    plaintext = new_key_text(prefix)
    key = ApiKey.objects.create(project=project, name=name[:100] or "default", prefix=prefix, hash=hash_key(plaintext))
    return key, plaintext


def apikey_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke a key (idempotent: the first revocation time is kept)."""
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=key.revoked_at)
    return key
