"""Skills: progressive disclosure (levels 1-3), validation of hostile skill
folders, and declared dependencies (the activation chain and the activator are in
test_skill_activation.py)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from pipeline import SkillLoader, validate_skill_name
from pipeline._exceptions import CircularDependencyError, SkillError
from pipeline._skills import MAX_FRONTMATTER_BYTES, MAX_RESOURCE_BYTES, MAX_SKILL_FILE_BYTES
from pipeline._tokens import DynamicTokenCounter
from tests.pipeline.skill_helpers import FIXTURES, MODEL, write_skill


# --- level 1 ------------------------------------------------------------------------


def test_it_loads_metadata_from_frontmatter(loader: SkillLoader) -> None:
    metadata = loader.load_metadata("sales-report")
    assert metadata.name == "sales-report"
    assert metadata.description.startswith("Build a monthly sales report")
    assert metadata.allowed_tools == ("query_database", "run_python")
    assert metadata.model == "claude-3-5-sonnet"
    assert metadata.version == "1.2.0"
    assert metadata.uses == ("data-cleaning",)
    assert metadata.disable_model_invocation is False


def test_it_accepts_hyphenated_keys_comma_tool_lists_and_numeric_versions(loader: SkillLoader) -> None:
    metadata = loader.load_metadata("data-cleaning")
    assert metadata.allowed_tools == ("query_database",)
    assert metadata.version == "2.0"
    assert "清洗业务数据" in metadata.description


def test_it_leaves_tools_unrestricted_when_frontmatter_names_none(loader: SkillLoader) -> None:
    assert loader.load_metadata("quick-note").allowed_tools is None


def test_it_counts_metadata_tokens_with_the_real_counter(
    loader: SkillLoader, counter: DynamicTokenCounter
) -> None:
    metadata = loader.load_metadata("data-cleaning")
    assert metadata.tokens == counter.count_tokens(metadata.summary, MODEL)
    assert metadata.tokens > 10


def test_it_reads_only_the_frontmatter_at_level_1(skills: Path, counter: DynamicTokenCounter) -> None:
    # A body that is not UTF-8 would fail a full read; level 1 never reaches it.
    write_skill(skills, "lazy", b"---\nname: lazy\ndescription: d\n---\n\xff\xfe not text\n")
    loader = SkillLoader(skills, token_counter=counter)
    assert loader.load_metadata("lazy").name == "lazy"
    with pytest.raises(SkillError, match="not UTF-8"):
        loader.load_full("lazy")


def test_it_lists_skills_sorted(loader: SkillLoader) -> None:
    names = [m.name for m in loader.list_skills()]
    assert names == ["cycle-a", "cycle-b", "data-cleaning", "quick-note", "sales-report"]


def test_it_skips_malformed_skills_when_listing_and_logs_why(
    skills: Path, counter: DynamicTokenCounter, caplog: pytest.LogCaptureFixture
) -> None:
    write_skill(skills, "broken", "---\nname: [unclosed\n---\nbody\n")
    (skills / "not-a-skill").mkdir()
    (skills / "README.txt").write_text("not a folder")
    loader = SkillLoader(skills, token_counter=counter)
    with caplog.at_level(logging.WARNING, logger="pipeline._skills"):
        names = [m.name for m in loader.list_skills()]
    assert "broken" not in names and "sales-report" in names
    assert "broken" in caplog.text
    with pytest.raises(SkillError, match="not valid YAML"):
        loader.list_skills(strict=True)


def test_it_reloads_metadata_after_the_file_changes(skills: Path, counter: DynamicTokenCounter) -> None:
    path = write_skill(skills, "changing", "---\nname: changing\ndescription: first\n---\nbody\n")
    loader = SkillLoader(skills, token_counter=counter)
    assert loader.load_metadata("changing").description == "first"
    path.write_text("---\nname: changing\ndescription: second version\n---\nbody\n")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert loader.load_metadata("changing").description == "second version"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("---\nname: [unclosed\ndescription: d\n---\n", "not valid YAML"),
        ("---\n- a\n- b\n---\n", "must be a YAML mapping"),
        ("---\njust a string\n---\n", "must be a YAML mapping"),
        ("---\n---\nbody", "must be a YAML mapping"),
        ("---\ndescription: no name here\n---\n", "has no 'name'"),
        ("---\nname: other-skill\ndescription: d\n---\n", "does not match its folder"),
        ("---\nname: Bad Name\ndescription: d\n---\n", "not a valid skill name"),
        ("---\nname: bad\n---\n", "non-empty 'description'"),
        ("---\nname: bad\ndescription: '   '\n---\n", "non-empty 'description'"),
        ("name: bad\ndescription: d\n", "must start with a '---'"),
        ("---\nname: bad\ndescription: d\n", "no closing '---'"),
        ("---\nname: bad\ndescription: d\nallowed_tools: 5\n---\n", "allowed_tools must be a list"),
        ("---\nname: bad\ndescription: d\nallowed_tools: [1, 2]\n---\n", "bad entry"),
        ("---\nname: bad\ndescription: d\ndisable_model_invocation: 'yes'\n---\n", "true or false"),
        ("---\nname: bad\ndescription: d\nuses: [../etc]\n---\n", "invalid skill name"),
        ("---\nname: bad\ndescription: d\nuses: other\n---\n", "uses must be a list"),
        ("---\nname: bad\ndescription: d\nuses: []\ndependencies: []\n---\n", "not both"),
        ("---\nname: bad\ndescription: d\nallowed_tools: []\nallowed-tools: []\n---\n", "twice"),
        ("---\nname: bad\ndescription: d\nmodel: [x]\n---\n", "model must be"),
        ("---\nname: bad\ndescription: " + "x" * 2000 + "\n---\n", "longer than"),
    ],
)
def test_it_refuses_malformed_frontmatter(
    skills: Path, counter: DynamicTokenCounter, text: str, problem: str
) -> None:
    write_skill(skills, "bad", text)
    loader = SkillLoader(skills, token_counter=counter)
    with pytest.raises(SkillError, match=problem):
        loader.load_metadata("bad")
    with pytest.raises(SkillError, match=problem):
        loader.load_full("bad")


def test_it_refuses_yaml_aliases_in_frontmatter(skills: Path, counter: DynamicTokenCounter) -> None:
    bomb = "---\nname: bad\ndescription: d\na: &a [x, x, x]\nb: [*a, *a, *a]\n---\n"
    write_skill(skills, "bad", bomb)
    with pytest.raises(SkillError, match="aliases are not allowed"):
        SkillLoader(skills, token_counter=counter).load_metadata("bad")


def test_it_refuses_yaml_tags_that_build_objects(skills: Path, counter: DynamicTokenCounter) -> None:
    write_skill(skills, "bad", "---\nname: bad\ndescription: !!python/object/apply:os.getcwd []\n---\n")
    with pytest.raises(SkillError, match="not valid YAML"):
        SkillLoader(skills, token_counter=counter).load_metadata("bad")


def test_it_refuses_an_unclosed_oversized_frontmatter(skills: Path, counter: DynamicTokenCounter) -> None:
    write_skill(skills, "big", "---\nname: big\ndescription: " + "x" * (MAX_FRONTMATTER_BYTES + 10))
    with pytest.raises(SkillError, match="not closed within"):
        SkillLoader(skills, token_counter=counter).load_metadata("big")


def test_it_refuses_an_oversized_skill_file_at_level_2(skills: Path, counter: DynamicTokenCounter) -> None:
    write_skill(skills, "big", "---\nname: big\ndescription: d\n---\n" + "y" * MAX_SKILL_FILE_BYTES)
    loader = SkillLoader(skills, token_counter=counter)
    assert loader.load_metadata("big").name == "big"  # level 1 is still cheap
    with pytest.raises(SkillError, match="larger than"):
        loader.load_full("big")


# --- names and folders ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["", "A", "Sales", "../etc", "a/b", "a\\b", "a\x00b", ".hidden", "-dash", "a" * 65, "a b", "ä", 5, None],
)
def test_it_refuses_invalid_skill_names(loader: SkillLoader, name: object) -> None:
    with pytest.raises(SkillError, match="invalid skill name"):
        validate_skill_name(name)
    with pytest.raises(SkillError):
        loader.load_metadata(name)  # type: ignore[arg-type]


def test_it_reports_a_missing_skill(loader: SkillLoader) -> None:
    with pytest.raises(SkillError, match="no skill named 'nope'"):
        loader.load_metadata("nope")


def test_it_refuses_a_folder_without_skill_file(skills: Path, counter: DynamicTokenCounter) -> None:
    (skills / "empty").mkdir()
    with pytest.raises(SkillError, match="has no SKILL.md"):
        SkillLoader(skills, token_counter=counter).load_metadata("empty")


def test_it_refuses_a_skill_folder_linked_from_outside(
    skills: Path, tmp_path: Path, counter: DynamicTokenCounter
) -> None:
    outside = tmp_path / "outside" / "evil"
    write_skill(outside.parent, "evil", "---\nname: evil\ndescription: d\n---\nbody\n")
    (skills / "evil").symlink_to(outside, target_is_directory=True)
    with pytest.raises(SkillError, match="outside the skills folder"):
        SkillLoader(skills, token_counter=counter).load_full("evil")


def test_it_refuses_a_skill_file_linked_from_outside(
    skills: Path, tmp_path: Path, counter: DynamicTokenCounter
) -> None:
    secret = tmp_path / "secret.md"
    secret.write_text("---\nname: evil\ndescription: d\n---\nsecret\n")
    (skills / "evil").mkdir()
    (skills / "evil" / "SKILL.md").symlink_to(secret)
    with pytest.raises(SkillError, match="not a file inside the skill folder"):
        SkillLoader(skills, token_counter=counter).load_full("evil")


def test_it_refuses_a_missing_skills_folder(tmp_path: Path, counter: DynamicTokenCounter) -> None:
    with pytest.raises(SkillError, match="does not exist"):
        SkillLoader(tmp_path / "nowhere", token_counter=counter)


# --- level 2 and 3 -------------------------------------------------------------------


def test_it_loads_the_body_without_the_frontmatter(
    loader: SkillLoader, counter: DynamicTokenCounter
) -> None:
    instructions = loader.load_full("sales-report")
    assert instructions.body.startswith("# Sales report")
    assert "allowed-tools" not in instructions.body
    assert instructions.tokens == counter.count_tokens(instructions.body, MODEL)
    assert instructions.metadata.name == "sales-report"


def test_it_loads_a_resource_on_demand(loader: SkillLoader, counter: DynamicTokenCounter) -> None:
    resource = loader.load_resource("sales-report", "references/report_format.md")
    text = (FIXTURES / "sales-report" / "references" / "report_format.md").read_text()
    assert resource.content == text
    assert resource.size_bytes == len(text.encode())
    assert resource.tokens == counter.count_tokens(text, MODEL)
    assert resource.path == "references/report_format.md"
    assert loader.load_resource("sales-report", "./scripts/summarise.py").path == "scripts/summarise.py"


def test_it_lists_resources_without_reading_them(loader: SkillLoader) -> None:
    assert loader.list_resources("sales-report") == [
        "scripts/summarise.py",
        "references/report_format.md",
        "assets/template.csv",
    ]
    assert loader.list_resources("quick-note") == []


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/etc/passwd", "relative to the skill"),
        ("C:/windows/win.ini", "relative to the skill"),
        ("../quick-note/SKILL.md", "must not contain '..'"),
        ("references/../../quick-note/SKILL.md", "must not contain '..'"),
        ("references/a\x00.md", "NUL or control"),
        ("references/a\n.md", "NUL or control"),
        ("references\\report_format.md", "'/' separators"),
        ("SKILL.md", "must point into"),
        ("references", "must point into"),
        ("other/report_format.md", "must point into"),
        ("", "non-empty string"),
        ("references/" + "a" * 600, "longer than"),
        ("references/missing.md", "has no resource"),
        ("references/", "must point into"),
    ],
)
def test_it_refuses_bad_resource_paths(loader: SkillLoader, path: str, problem: str) -> None:
    with pytest.raises(SkillError, match=problem):
        loader.load_resource("sales-report", path)


def test_it_refuses_a_non_string_resource_path(loader: SkillLoader) -> None:
    with pytest.raises(SkillError, match="non-empty string"):
        loader.load_resource("sales-report", None)  # type: ignore[arg-type]


def test_it_refuses_a_resource_symlink_that_escapes_the_skill(
    skills: Path, tmp_path: Path, counter: DynamicTokenCounter
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("password")
    (skills / "sales-report" / "references" / "leak.md").symlink_to(secret)
    (skills / "sales-report" / "scripts" / "up").symlink_to(skills / "quick-note", target_is_directory=True)
    loader = SkillLoader(skills, token_counter=counter)
    with pytest.raises(SkillError, match="outside the skill folder"):
        loader.load_resource("sales-report", "references/leak.md")
    with pytest.raises(SkillError, match="outside the skill folder"):
        loader.load_resource("sales-report", "scripts/up/SKILL.md")
    listed = loader.list_resources("sales-report")
    assert "references/leak.md" not in listed and not any("up/" in p for p in listed)


def test_it_refuses_a_resource_symlink_to_the_skill_file(skills: Path, counter: DynamicTokenCounter) -> None:
    (skills / "sales-report" / "references" / "me.md").symlink_to(skills / "sales-report" / "SKILL.md")
    with pytest.raises(SkillError, match="outside its resource folders"):
        SkillLoader(skills, token_counter=counter).load_resource("sales-report", "references/me.md")


def test_it_refuses_a_symlink_loop(skills: Path, counter: DynamicTokenCounter) -> None:
    loop = skills / "sales-report" / "references" / "loop.md"
    loop.symlink_to(loop)
    with pytest.raises(SkillError, match="loop.md"):
        SkillLoader(skills, token_counter=counter).load_resource("sales-report", "references/loop.md")


def test_it_refuses_an_oversized_resource(skills: Path, counter: DynamicTokenCounter) -> None:
    (skills / "sales-report" / "assets" / "huge.txt").write_bytes(b"z" * (MAX_RESOURCE_BYTES + 1))
    (skills / "sales-report" / "assets" / "edge.txt").write_bytes(b"z" * MAX_RESOURCE_BYTES)
    loader = SkillLoader(skills, token_counter=counter)
    with pytest.raises(SkillError, match=f"larger than {MAX_RESOURCE_BYTES} bytes"):
        loader.load_resource("sales-report", "assets/huge.txt")
    assert loader.load_resource("sales-report", "assets/edge.txt").size_bytes == MAX_RESOURCE_BYTES


def test_it_refuses_binary_resources_and_directories(skills: Path, counter: DynamicTokenCounter) -> None:
    (skills / "sales-report" / "assets" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\x00")
    (skills / "sales-report" / "assets" / "sub").mkdir()
    loader = SkillLoader(skills, token_counter=counter)
    with pytest.raises(SkillError, match="not UTF-8 text"):
        loader.load_resource("sales-report", "assets/logo.png")
    with pytest.raises(SkillError, match="is not a file"):
        loader.load_resource("sales-report", "assets/sub")


# --- declared dependencies -----------------------------------------------------------


def test_it_resolves_declared_uses_dependencies_first(loader: SkillLoader) -> None:
    assert loader.resolve_uses("sales-report") == ["data-cleaning"]
    assert loader.resolve_uses("quick-note") == []


def test_it_refuses_a_declared_cycle(loader: SkillLoader) -> None:
    with pytest.raises(CircularDependencyError, match="Circular dependency detected: cycle-a → cycle-b → cycle-a"):
        loader.resolve_uses("cycle-a")


def test_it_refuses_declared_uses_deeper_than_the_limit(skills: Path, counter: DynamicTokenCounter) -> None:
    for level in range(5):
        uses = f"uses: [deep-{level + 1}]\n" if level < 4 else ""
        write_skill(skills, f"deep-{level}", f"---\nname: deep-{level}\ndescription: d\n{uses}---\nb\n")
    loader = SkillLoader(skills, token_counter=counter)
    assert loader.resolve_uses("deep-1") == ["deep-4", "deep-3", "deep-2"]
    with pytest.raises(SkillError, match=r"Maximum skill activation depth \(3\) exceeded"):
        loader.resolve_uses("deep-0")


def test_it_uses_the_shared_real_counter_by_default() -> None:
    from pipeline._tokens import DEFAULT_MODEL, get_token_counter

    metadata = SkillLoader(FIXTURES).load_metadata("quick-note")
    assert metadata.tokens == get_token_counter().count_tokens(metadata.summary, DEFAULT_MODEL) > 0
