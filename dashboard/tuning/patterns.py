"""The one wildcard matcher of the tuning rules (encoder margins, prices).

A rule's pattern is a name (``claude``, ``gpt-4o``) or an fnmatch wildcard over
names (``*``, ``g*``, ``claude-3-5-sonnet*``), matched case-insensitively. When
several patterns match one name, an exact one wins, then the most specific
wildcard (the most literal characters), as the pipeline's encoder registry ranks
its own patterns.
"""

from __future__ import annotations

import fnmatch
from typing import Iterable, Optional, TypeVar

WILDCARDS = "*?["
T = TypeVar("T")


def normalized(pattern: str) -> str:
    return pattern.strip().lower()


def literal_part(pattern: str) -> str:
    """The pattern's text with its wildcards taken out (``gpt-4o*`` -> ``gpt-4o``)."""
    return "".join(ch for ch in normalized(pattern) if ch not in "*?[]")


def match_rank(pattern: str, name: str) -> Optional[tuple[int, int]]:
    """None when ``pattern`` does not match ``name``; else a rank, higher wins:
    (1 for an exact pattern, number of literal characters)."""
    pattern, name = normalized(pattern), name.strip().lower()
    exact = not any(ch in pattern for ch in WILDCARDS)
    if not (pattern == name if exact else fnmatch.fnmatchcase(name, pattern)):
        return None
    return (int(exact), len(literal_part(pattern)))


def best_match(patterns: Iterable[tuple[str, T]], name: str) -> list[T]:
    """The items whose pattern matches ``name``, best rank first."""
    ranked = [(rank, i, item) for i, (pattern, item) in enumerate(patterns)
              if (rank := match_rank(pattern, name)) is not None]
    ranked.sort(key=lambda entry: (entry[0], -entry[1]), reverse=True)
    return [item for _, _, item in ranked]
