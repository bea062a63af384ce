"""Skills with progressive disclosure: a skill is a folder with a SKILL.md whose YAML
frontmatter says what it is, whose body says how to do it, and whose scripts/,
references/ and assets/ hold material read only when asked for.

Three load levels keep the context small: level 1 is the frontmatter (what the model
needs to choose a skill), level 2 the body (what it needs to follow it), level 3 the
resource files (what it needs on demand). Every load says how many tokens it cost.

A skill is untrusted input: names and resource paths are validated, a resource that
resolves outside its skill's folder is refused, and every read is size-capped.

This module finds and loads skills (``SkillLoader``), including the ``uses``
dependencies a skill declares; activating them, nested and without cycles, is
``_skill_activation``, which the loader's ``load_skill`` calls on. What both need (the
name rule, the level models) is ``_skill_models``, below them.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path, PurePosixPath
from typing import Any, Optional, Protocol

import yaml

from ._exceptions import CircularDependencyError, SkillError
from ._skill_activation import ContextModifier, SkillActivationRequest, SkillActivationResult, SkillActivator
from ._skill_models import (
    SKILL_NAME_RE,
    SkillInstructions,
    SkillMetadata,
    SkillResource,
    cycle_message,
    depth_message,
    validate_skill_name,
)
from ._tokens import DEFAULT_MODEL

logger = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"
RESOURCE_FOLDERS = ("scripts", "references", "assets")

MAX_FRONTMATTER_BYTES = 64 * 1024  # level 1 reads no further than this
MAX_SKILL_FILE_BYTES = 1024 * 1024  # a whole SKILL.md (level 2)
MAX_RESOURCE_BYTES = 1024 * 1024  # one resource file (level 3)
MAX_RESOURCE_PATH_CHARS = 512
MAX_LISTED_RESOURCES = 1000
MAX_DESCRIPTION_CHARS = 1024


class TokenCounter(Protocol):
    """What the loader needs from a token counter (pipeline.DynamicTokenCounter fits)."""

    def count_tokens(self, text: str, model: str) -> int: ...


def _validate_resource_path(relative_path: Any) -> PurePosixPath:
    """Check a resource path's shape before it touches the file system."""
    if not isinstance(relative_path, str) or not relative_path:
        raise SkillError("resource path must be a non-empty string")
    if len(relative_path) > MAX_RESOURCE_PATH_CHARS:
        raise SkillError(f"resource path is longer than {MAX_RESOURCE_PATH_CHARS} characters")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in relative_path):
        raise SkillError("resource path contains a NUL or control character")
    if "\\" in relative_path:
        raise SkillError("resource path must use '/' separators")
    path = PurePosixPath(relative_path)
    if path.is_absolute() or re.match(r"^[A-Za-z]:", relative_path):
        raise SkillError(f"resource path must be relative to the skill: {relative_path!r}")
    if ".." in path.parts:
        raise SkillError(f"resource path must not contain '..': {relative_path!r}")
    if len(path.parts) < 2 or path.parts[0] not in RESOURCE_FOLDERS:
        raise SkillError(
            f"resource path must point into {', '.join(f'{f}/' for f in RESOURCE_FOLDERS)}: "
            f"{relative_path!r}"
        )
    return path


# --- frontmatter ---------------------------------------------------------------------


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader without anchors/aliases: frontmatter never needs them, and refusing
    them rules out alias bombs in a hostile SKILL.md."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(
                None, None, "aliases are not allowed in skill frontmatter", mark
            )
        return super().compose_node(parent, index)


def _split_skill_file(text: str, skill_name: str) -> tuple[str, str]:
    """Split SKILL.md text into (frontmatter YAML, body)."""
    text = text.removeprefix("\ufeff")
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise SkillError(f"skill {skill_name!r}: {SKILL_FILE} must start with a '---' frontmatter line")
    for index in range(1, len(lines)):
        if lines[index].strip() == "---":
            return "".join(lines[1:index]), "".join(lines[index + 1 :]).lstrip("\r\n")
    raise SkillError(f"skill {skill_name!r}: frontmatter has no closing '---' line")


def _read_frontmatter_text(path: Path, skill_name: str) -> str:
    """Read only the frontmatter (level 1 never reads the body)."""
    collected: list[bytes] = []
    size = 0
    with open(path, "rb") as handle:
        number = -1
        while size <= MAX_FRONTMATTER_BYTES:
            # readline with a limit: a hostile file with one huge line is not read whole
            raw = handle.readline(MAX_FRONTMATTER_BYTES + 1 - size)
            if not raw:
                break
            number += 1
            size += len(raw)
            if size > MAX_FRONTMATTER_BYTES:
                break
            line = raw.decode("utf-8", errors="strict") if number else raw.decode("utf-8-sig")
            if number == 0:
                if line.strip() != "---":
                    raise SkillError(
                        f"skill {skill_name!r}: {SKILL_FILE} must start with a '---' frontmatter line"
                    )
                continue
            if line.strip() == "---":
                return b"".join(collected).decode("utf-8")
            collected.append(raw)
    if size > MAX_FRONTMATTER_BYTES:
        raise SkillError(
            f"skill {skill_name!r}: frontmatter is not closed within {MAX_FRONTMATTER_BYTES} bytes"
        )
    raise SkillError(f"skill {skill_name!r}: frontmatter has no closing '---' line")


def _tool_list(value: Any, skill_name: str) -> Optional[tuple[str, ...]]:
    """allowed_tools as a YAML list or Claude-Code-style 'Read, Grep' string."""
    if value is None:
        return None
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, list):
        items = value
    else:
        raise SkillError(f"skill {skill_name!r}: allowed_tools must be a list of tool names")
    for item in items:
        if not isinstance(item, str) or not item.strip() or len(item) > 200:
            raise SkillError(f"skill {skill_name!r}: allowed_tools has a bad entry {str(item)[:40]!r}")
    return tuple(item.strip() for item in items)


def _parse_frontmatter(yaml_text: str, folder_name: str) -> dict[str, Any]:
    """Parse and validate frontmatter into SkillMetadata fields."""
    try:
        data = yaml.load(yaml_text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SkillError(f"skill {folder_name!r}: frontmatter is not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise SkillError(f"skill {folder_name!r}: frontmatter must be a YAML mapping")
    # Claude Code spells keys with hyphens (allowed-tools); accept both, not both at once.
    fields: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise SkillError(f"skill {folder_name!r}: frontmatter keys must be strings")
        normal = key.replace("-", "_")
        if normal in fields:
            raise SkillError(f"skill {folder_name!r}: frontmatter sets {normal!r} twice")
        fields[normal] = value

    name = fields.get("name")
    if name is None:
        raise SkillError(f"skill {folder_name!r}: frontmatter has no 'name'")
    if not isinstance(name, str) or not SKILL_NAME_RE.match(name):
        raise SkillError(f"skill {folder_name!r}: frontmatter name {str(name)[:80]!r} is not a valid skill name")
    if name != folder_name:
        raise SkillError(f"skill {folder_name!r}: frontmatter name {name!r} does not match its folder")
    description = fields.get("description")
    if not isinstance(description, str) or not description.strip():
        raise SkillError(f"skill {folder_name!r}: frontmatter needs a non-empty 'description'")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise SkillError(
            f"skill {folder_name!r}: description is longer than {MAX_DESCRIPTION_CHARS} characters"
        )
    model = fields.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip() or len(model) > 200):
        raise SkillError(f"skill {folder_name!r}: model must be a model name")
    disable = fields.get("disable_model_invocation", False)
    if not isinstance(disable, bool):
        raise SkillError(f"skill {folder_name!r}: disable_model_invocation must be true or false")
    version = fields.get("version", "1.0.0")
    if isinstance(version, bool) or not isinstance(version, (str, int, float)):
        raise SkillError(f"skill {folder_name!r}: version must be a string")
    if "uses" in fields and "dependencies" in fields:
        raise SkillError(f"skill {folder_name!r}: give 'uses' or 'dependencies', not both")
    uses = fields.get("uses", fields.get("dependencies")) or []
    if not isinstance(uses, list):
        raise SkillError(f"skill {folder_name!r}: uses must be a list of skill names")
    for used in uses:
        try:
            validate_skill_name(used)
        except SkillError:
            raise SkillError(f"skill {folder_name!r}: uses has an invalid skill name {str(used)[:80]!r}") from None
    return {
        "name": name,
        "description": description.strip(),
        "allowed_tools": _tool_list(fields.get("allowed_tools"), folder_name),
        "model": model.strip() if isinstance(model, str) else None,
        "disable_model_invocation": disable,
        "version": str(version)[:64],
        "uses": tuple(uses),
    }


# --- loader --------------------------------------------------------------------------


def _default_token_counter() -> TokenCounter:
    from ._tokens import get_token_counter  # late: the shared counter loads encodings on first use

    return get_token_counter()


class SkillLoader:
    """Loads skills from ``skills_dir/<name>/SKILL.md`` level by level.

    Level-1 metadata is cached per file (keyed by its mtime and size) because the
    skill list is rebuilt every round; bodies and resources are read when asked for.
    """

    def __init__(
        self,
        skills_dir: str | os.PathLike[str],
        *,
        token_counter: Optional[TokenCounter] = None,
        model: str = DEFAULT_MODEL,
    ) -> None:
        self.skills_dir = Path(skills_dir)
        if not self.skills_dir.is_dir():
            raise SkillError(f"skills folder does not exist: {self.skills_dir}")
        self._root = self.skills_dir.resolve()
        self.token_counter = token_counter if token_counter is not None else _default_token_counter()
        self.model = model
        self._metadata_cache: dict[str, tuple[tuple[int, int], SkillMetadata]] = {}
        self._cache_lock = threading.Lock()

    def count_tokens(self, text: str) -> int:
        return int(self.token_counter.count_tokens(text, self.model)) if text else 0

    # paths

    def skill_folder(self, name: str) -> Path:
        """The resolved folder of skill ``name``; refuses one that lives outside skills_dir."""
        validate_skill_name(name)
        folder = self.skills_dir / name
        if not folder.is_dir():
            raise SkillError(f"no skill named {name!r}")
        resolved = folder.resolve()
        if not resolved.is_relative_to(self._root) or resolved == self._root:
            raise SkillError(f"skill {name!r} resolves outside the skills folder")
        return resolved

    def _skill_file(self, name: str) -> Path:
        folder = self.skill_folder(name)
        path = folder / SKILL_FILE
        if not path.exists():
            raise SkillError(f"skill {name!r} has no {SKILL_FILE}")
        resolved = path.resolve()
        if not resolved.is_relative_to(folder) or not resolved.is_file():
            raise SkillError(f"skill {name!r}: {SKILL_FILE} is not a file inside the skill folder")
        return resolved

    # level 1

    def load_metadata(self, name: str) -> SkillMetadata:
        """Level 1: the frontmatter only; the body is not read."""
        path = self._skill_file(name)
        stat = path.stat()
        key = (stat.st_mtime_ns, stat.st_size)
        with self._cache_lock:
            cached = self._metadata_cache.get(name)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            yaml_text = _read_frontmatter_text(path, name)
        except UnicodeDecodeError:
            raise SkillError(f"skill {name!r}: {SKILL_FILE} is not UTF-8 text") from None
        fields = _parse_frontmatter(yaml_text, name)
        draft = SkillMetadata(**fields)
        metadata = draft.model_copy(update={"tokens": self.count_tokens(draft.summary)})
        with self._cache_lock:
            self._metadata_cache[name] = (key, metadata)
        return metadata

    def list_skills(self, *, strict: bool = False) -> list[SkillMetadata]:
        """Level 1 for every skill folder, sorted by name.

        A malformed skill is skipped with a warning (one bad folder must not hide the
        others from the agent) unless ``strict``, which raises its SkillError.
        """
        found: list[SkillMetadata] = []
        for entry in sorted(self.skills_dir.iterdir(), key=lambda p: p.name):
            if not entry.is_dir() or not (entry / SKILL_FILE).exists():
                continue
            try:
                found.append(self.load_metadata(entry.name))
            except SkillError as exc:
                if strict:
                    raise
                logger.warning("skipping skill folder %r: %s", entry.name[:80], exc)
        return found

    # level 2

    def load_full(self, name: str) -> SkillInstructions:
        """Level 2: the SKILL.md body, with the frontmatter validated again."""
        path = self._skill_file(name)
        raw = _read_capped(path, MAX_SKILL_FILE_BYTES, f"skill {name!r}: {SKILL_FILE}")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SkillError(f"skill {name!r}: {SKILL_FILE} is not UTF-8 text") from None
        yaml_text, body = _split_skill_file(text, name)
        draft = SkillMetadata(**_parse_frontmatter(yaml_text, name))
        metadata = draft.model_copy(update={"tokens": self.count_tokens(draft.summary)})
        return SkillInstructions(metadata=metadata, body=body, tokens=self.count_tokens(body))

    # level 3

    def load_resource(self, name: str, relative_path: str) -> SkillResource:
        """Level 3: one resource file, read now, as UTF-8 text, at most MAX_RESOURCE_BYTES."""
        parts = _validate_resource_path(relative_path)
        folder = self.skill_folder(name)
        candidate = folder.joinpath(*parts.parts)
        try:
            resolved = candidate.resolve(strict=True)
        except (FileNotFoundError, NotADirectoryError):
            raise SkillError(f"skill {name!r} has no resource {str(parts)!r}") from None
        except (OSError, RuntimeError) as exc:  # symlink loops and the like
            raise SkillError(f"skill {name!r}: cannot resolve resource {str(parts)!r}: {exc}") from None
        if not resolved.is_relative_to(folder):
            raise SkillError(f"skill {name!r}: resource {str(parts)!r} resolves outside the skill folder")
        inside = resolved.relative_to(folder).parts
        if len(inside) < 2 or inside[0] not in RESOURCE_FOLDERS:
            raise SkillError(f"skill {name!r}: resource {str(parts)!r} resolves outside its resource folders")
        if not resolved.is_file():
            raise SkillError(f"skill {name!r}: resource {str(parts)!r} is not a file")
        raw = _read_capped(resolved, MAX_RESOURCE_BYTES, f"skill {name!r}: resource {str(parts)!r}")
        try:
            content = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SkillError(f"skill {name!r}: resource {str(parts)!r} is not UTF-8 text") from None
        return SkillResource(
            skill_name=name,
            path=str(parts),
            content=content,
            size_bytes=len(raw),
            tokens=self.count_tokens(content),
        )

    def list_resources(self, name: str) -> list[str]:
        """Resource paths a skill offers (not read), for the model to ask for by name.

        Symlinks are not followed into folders; files resolving outside the skill are left out.
        """
        folder = self.skill_folder(name)
        found: list[str] = []
        for top in RESOURCE_FOLDERS:
            base = folder / top
            if not base.is_dir() or not base.resolve().is_relative_to(folder):
                continue
            for current, dirs, files in os.walk(base, followlinks=False):
                dirs.sort()
                for file_name in sorted(files):
                    full = Path(current) / file_name
                    if not full.resolve().is_relative_to(folder):
                        continue
                    found.append(full.relative_to(folder).as_posix())
                    if len(found) >= MAX_LISTED_RESOURCES:
                        return found
        return found

    # the design's names (v2.0 "Progressive Disclosure Implementation")

    def load_skill(self, skill_name: str, level: int = 2) -> SkillActivationResult:
        """The skill at disclosure ``level`` (1 metadata, 2 full instructions,
        3 with the list of its resources) as a ``SkillActivationResult``; a skill
        that cannot be loaded gives a failed result, never an exception."""
        return SkillActivator(self).activate(SkillActivationRequest(skill_name=skill_name, load_level=level))

    def _get_skill_path(self, skill_name: str) -> Path:
        return self.skill_folder(skill_name)

    def _load_frontmatter(self, skill_name: str) -> dict[str, Any]:
        """Level 1 as a dict."""
        return self.load_metadata(skill_name).model_dump()

    def _load_skill_md(self, skill_name: str) -> str:
        """Level 2: the SKILL.md body after the frontmatter."""
        return self.load_full(skill_name).body

    def _load_resources(self, skill_name: str) -> dict[str, str]:
        """Level 3 as the design reads it: the files under ``scripts/`` and
        ``references/`` (with the usual size and path checks), keyed by their path
        in the skill."""
        return {
            path: self.load_resource(skill_name, path).content
            for path in self.list_resources(skill_name)
            if path.startswith(("scripts/", "references/"))
        }

    def _get_context_modifier(self, skill_name: str) -> ContextModifier:
        return ContextModifier.from_metadata(self.load_metadata(skill_name))

    # dependencies

    def resolve_uses(self, name: str, *, max_depth: int = 3) -> list[str]:
        """The skills ``name`` uses, transitively, dependencies first.

        Raises CircularDependencyError ('a → b → a') for a cycle in the ``uses``
        declarations and SkillError for a chain deeper than ``max_depth``.
        """
        order: list[str] = []
        done: set[str] = set()

        def visit(skill: str, chain: list[str]) -> None:
            if skill in chain:
                raise CircularDependencyError(cycle_message(chain[chain.index(skill) :] + [skill]))
            if skill in done:
                return
            if len(chain) > max_depth:
                raise SkillError(depth_message(max_depth, chain + [skill]))
            for used in self.load_metadata(skill).uses:
                visit(used, chain + [skill])
            done.add(skill)
            order.append(skill)

        visit(name, [])
        return order[:-1]


def _read_capped(path: Path, limit: int, what: str) -> bytes:
    """Read a file, refusing one larger than ``limit`` (checked before and while reading)."""
    if path.stat().st_size > limit:
        raise SkillError(f"{what} is larger than {limit} bytes")
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise SkillError(f"{what} is larger than {limit} bytes")
    return data
