"""Shared by the skill loading and activation tests: the fixture skills and a way
to write hostile ones (not a test module; the pytest fixtures are in conftest.py)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "skills_fixtures"
MODEL = "gpt-4o"


def write_skill(root: Path, folder: str, text: str | bytes) -> Path:
    path = root / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path
