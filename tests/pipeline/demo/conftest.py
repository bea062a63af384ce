"""Fixtures of the demo tests: the sales database is built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.demo.data import build_sales_database


@pytest.fixture(scope="session")
def sales_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sales_database(tmp_path_factory.mktemp("sales") / "sales.sqlite3")
