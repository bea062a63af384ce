"""What a skill is, for both sides that handle one: its name rule, the models of its
three load levels, and how a refused chain of skills is told. Loading skills
(``_skills``) and activating them (``_skill_activation``) build on this module, and
the loader on the activator, so each import goes one way.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from ._exceptions import SkillError

SKILL_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
SKILL_NAME_RE = re.compile(SKILL_NAME_PATTERN)

LoadLevel = Literal[1, 2, 3]


def validate_skill_name(name: Any) -> str:
    """Return ``name`` if it is a well-formed skill name, else raise SkillError.

    Names become folder names, so the pattern leaves no room for paths or traversal.
    """
    if not isinstance(name, str) or not SKILL_NAME_RE.match(name):
        shown = repr(name)[:80]
        raise SkillError(
            f"invalid skill name {shown}: expected lowercase letters, digits, '-' or '_' "
            "(1-64 characters, starting with a letter or digit)"
        )
    return name


class SkillMetadata(BaseModel):
    """Level 1: a skill's frontmatter, all the model needs to decide to use it.

    ``tokens`` is the cost of ``summary`` (the line the model sees in its skill list).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    allowed_tools: Optional[tuple[str, ...]] = None  # None: no restriction
    model: Optional[str] = None
    disable_model_invocation: bool = False
    version: str = "1.0.0"
    uses: tuple[str, ...] = ()  # skills this one activates
    tokens: int = Field(default=0, ge=0)

    @property
    def summary(self) -> str:
        return f"{self.name}: {self.description}"


class SkillInstructions(BaseModel):
    """Level 2: the SKILL.md body (the frontmatter excluded) and its token cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metadata: SkillMetadata
    body: str
    tokens: int = Field(ge=0)


class SkillResource(BaseModel):
    """Level 3: one file under scripts/, references/ or assets/, read on demand."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    skill_name: str
    path: str  # relative to the skill folder, '/'-separated
    content: str
    size_bytes: int = Field(ge=0)
    tokens: int = Field(ge=0)


# --- a refused chain -------------------------------------------------------------------


def cycle_message(path: list[str]) -> str:
    return f"Circular dependency detected: {' → '.join(path)}"


def depth_message(max_depth: int, path: list[str]) -> str:
    return f"Maximum skill activation depth ({max_depth}) exceeded: {' → '.join(path)}"
