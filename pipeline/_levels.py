"""Output levels: how verbose an observation is (an engineering choice, orthogonal
to what the observation says)."""

from __future__ import annotations

from enum import Enum


class OutputLevel(str, Enum):
    """Verbosity of a tool observation: BRIEF (key facts), STANDARD (actionable
    preview), FULL (complete data, or an artifact reference when large)."""

    BRIEF = "brief"
    STANDARD = "standard"
    FULL = "full"
