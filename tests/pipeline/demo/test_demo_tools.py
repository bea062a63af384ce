"""The demo's tools do real work on the bundled data and refuse what they must."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from pipeline import ArtifactStore, InvalidArtifactId, ToolError, ToolErrorType
from pipeline.demo.tools import DemoTools, SalesDatabase, calculate, read_file, terms


@pytest.fixture
def tools(sales_db: Path, tmp_path: Path) -> DemoTools:
    store = ArtifactStore(tmp_path / "artifacts")
    return DemoTools(sales_db, artifact_reader=store.retrieve)


def _order_count(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT COUNT(*) FROM orders").fetchone()[0]


# --- query_database ---------------------------------------------------------------------


def test_it_aggregates_revenue_by_region(tools: DemoTools) -> None:
    rows = tools.query_database("SELECT region, SUM(revenue) AS revenue FROM orders GROUP BY region ORDER BY revenue DESC")
    assert [row["region"] for row in rows] == ["East", "South", "North", "West"]  # the data's weights
    assert all(row["revenue"] > 0 for row in rows)


def test_it_caps_rows_at_the_limit(tools: DemoTools) -> None:
    assert len(tools.query_database("SELECT id FROM orders", limit=7)) == 7


@pytest.mark.parametrize("sql", ["", "   ", None, 42])
def test_it_refuses_empty_or_non_text_sql(tools: DemoTools, sql: object) -> None:
    with pytest.raises(ValueError, match="non-empty SELECT"):
        tools.query_database(sql)  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [0, -1, 50_001, "10", 2.5])
def test_it_refuses_a_bad_limit(tools: DemoTools, limit: object) -> None:
    with pytest.raises(ValueError, match="limit"):
        tools.query_database("SELECT 1", limit=limit)  # type: ignore[arg-type]


def test_it_reports_an_unknown_column_as_bad_input(tools: DemoTools) -> None:
    with pytest.raises(ValueError, match="SQL error: no such column"):
        tools.query_database("SELECT discount_rate FROM orders")


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM orders",
        "UPDATE orders SET revenue = 0",
        "INSERT INTO products VALUES (99, 'x', 'y', 1.0)",
        "DROP TABLE orders",
        "CREATE TABLE t (x)",
        "ATTACH DATABASE '/tmp/evil.sqlite3' AS evil",
        "PRAGMA writable_schema = 1",
        "PRAGMA table_info(orders)",
        "WITH gone AS (SELECT 1) DELETE FROM orders",
        "SELECT load_extension('/tmp/evil.so')",
        "VACUUM INTO '/tmp/copy.sqlite3'",
    ],
)
def test_it_refuses_writes_attach_and_pragma(tools: DemoTools, sales_db: Path, sql: str) -> None:
    before = _order_count(sales_db)
    with pytest.raises(ValueError):
        tools.query_database(sql)
    assert _order_count(sales_db) == before
    assert not Path("/tmp/evil.sqlite3").exists() and not Path("/tmp/copy.sqlite3").exists()


@pytest.mark.parametrize("sql", ["SELECT 1; DROP TABLE orders", "SELECT 1; SELECT 2;", "SELECT 1 /* ; */\n; DELETE FROM orders"])
def test_it_refuses_several_statements(tools: DemoTools, sales_db: Path, sql: str) -> None:
    with pytest.raises(ValueError, match="one statement"):
        tools.query_database(sql)
    assert _order_count(sales_db) > 0


def test_it_aborts_a_query_past_its_deadline(sales_db: Path) -> None:
    database = SalesDatabase(sales_db, deadline_seconds=0.05)
    with pytest.raises(TimeoutError, match="exceeded"):
        database.query("SELECT COUNT(*) FROM orders a, orders b WHERE a.region = b.region")


# --- file_reader ------------------------------------------------------------------------


def test_it_reads_a_csv_file_as_rows(tools: DemoTools) -> None:
    rows = tools.file_reader("regions.csv")
    assert isinstance(rows, list) and rows and isinstance(rows[0], dict)


def test_it_reads_a_text_file(tools: DemoTools) -> None:
    assert "Q3" in tools.file_reader("q3_report.md")


def test_it_reads_a_stored_artifact_back(sales_db: Path, tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    info = store.store(b'[{"id": 1}]', content_type="application/json")
    assert DemoTools(sales_db, artifact_reader=store.retrieve).file_reader(info.artifact_id) == '[{"id": 1}]'


def test_it_names_the_available_files_for_a_missing_one(tools: DemoTools) -> None:
    with pytest.raises(FileNotFoundError, match="available: pricing_policy.txt, q3_report.md, regions.csv"):
        tools.file_reader("q4_report.md")


@pytest.mark.parametrize("name", ["", None, 7])
def test_it_refuses_an_empty_file_name(tools: DemoTools, name: object) -> None:
    with pytest.raises(ValueError):
        tools.file_reader(name)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name",
    ["../data.py", "../../tools.py", "/etc/passwd", "files/../data.py", "..", ".", "q3_report.md\x00.txt", "~/.ssh/id_rsa"],
)
def test_it_refuses_path_traversal(tools: DemoTools, name: str) -> None:
    with pytest.raises(FileNotFoundError, match="no file named"):
        tools.file_reader(name)


@pytest.mark.parametrize("name", ["artifact_../../etc/passwd", "artifact_XYZ", "artifact_" + "0" * 65])
def test_it_refuses_a_malformed_artifact_id(tools: DemoTools, name: str) -> None:
    with pytest.raises(InvalidArtifactId):
        tools.file_reader(name)


def test_it_has_no_artifacts_without_a_store() -> None:
    with pytest.raises(FileNotFoundError, match="no artifact store"):
        read_file("artifact_" + "a" * 64)


# --- web_search and vector_search ---------------------------------------------------------


def test_it_finds_news_by_keyword(tools: DemoTools) -> None:
    hits = tools.web_search("retail sales outlook next quarter")
    assert 1 <= len(hits) <= 3
    assert {"id", "title", "url", "snippet", "score"} <= set(hits[0])


def test_it_clamps_top_k(tools: DemoTools) -> None:
    assert len(tools.web_search("sales", top_k=1000)) <= 10
    assert len(tools.vector_search("sales", top_k=-5)) == 1


@pytest.mark.parametrize("query", ["", "   ", None])
def test_it_refuses_an_empty_search(tools: DemoTools, query: object) -> None:
    with pytest.raises(ValueError):
        tools.web_search(query)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        tools.vector_search(query)  # type: ignore[arg-type]


def test_it_refuses_a_non_numeric_top_k(tools: DemoTools) -> None:
    with pytest.raises(ValueError):
        tools.web_search("sales", top_k="many")  # type: ignore[arg-type]


def test_it_survives_a_huge_hostile_query(tools: DemoTools) -> None:
    hits = tools.vector_search("'; DROP TABLE orders; -- " * 20_000 + "华东" * 1000)
    assert isinstance(hits, list)


def test_it_finds_chinese_documents_by_vector(tools: DemoTools) -> None:
    hits = tools.vector_search("华东地区 需求 增长")
    assert "华东" in hits[0]["title"]


def test_it_splits_chinese_into_bigrams() -> None:
    assert terms("华东需求") == ["华", "东", "需", "求", "华东", "东需", "需求"]


def test_it_fails_the_next_search_when_a_fault_is_armed(tools: DemoTools) -> None:
    tools.search_faults.fail_next(ToolError(ToolErrorType.RATE_LIMIT, "slow down"))
    with pytest.raises(ToolError):
        tools.web_search("sales")
    assert tools.web_search("sales")  # once only


def test_it_disarms_unused_faults(tools: DemoTools) -> None:
    tools.search_faults.fail_next(ToolError(ToolErrorType.RATE_LIMIT, "slow down"))
    tools.search_faults.clear()
    assert tools.web_search("sales")


# --- calculator ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [("round(2 + 3 * 4 / 5, 1)", 4.4), ("-(2 ** 10) % 7", 5), ("max(1, 5, 3) - abs(-2)", 3), ("sqrt(16) // 3", 1.0)],
)
def test_it_evaluates_arithmetic(tools: DemoTools, expression: str, value: float) -> None:
    assert tools.calculator(expression) == {"expression": expression, "result": value}


@pytest.mark.parametrize("expression", ["", "   ", None, "1 +", "x" * 501, "2 +* 3"])
def test_it_refuses_bad_expressions(expression: object) -> None:
    with pytest.raises(ValueError):
        calculate(expression)  # type: ignore[arg-type]


def test_it_refuses_division_by_zero() -> None:
    with pytest.raises(ValueError, match="division by zero"):
        calculate("(120000 - 0) / 0 * 100")


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('touch /tmp/pwned')",
        "().__class__.__bases__[0].__subclasses__()",
        "open('/etc/passwd').read()",
        "eval('1+1')",
        "(lambda: 1)()",
        "[1, 2, 3]",
        "'a' * 10",
        "True + 1",
        "round(1.234, ndigits=1)",
        "abs.__call__(-1)",
        "9 ** 9 ** 9",
        "x",
    ],
)
def test_it_refuses_code_injection(expression: str) -> None:
    with pytest.raises(ValueError):
        calculate(expression)
    assert not Path("/tmp/pwned").exists()


def test_it_evaluates_the_deepest_nesting_its_length_limit_allows() -> None:
    assert calculate("-" * 499 + "1") == -1  # 499 levels of recursion stay far from the limit


def test_it_refuses_parentheses_nested_past_the_parser_limit() -> None:
    with pytest.raises(ValueError, match="not an arithmetic expression"):
        calculate("(" * 240 + "1" + ")" * 240)
