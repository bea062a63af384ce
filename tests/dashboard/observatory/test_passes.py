"""The passes' order and declarations are what docs/derivations.md draws."""

from __future__ import annotations

import re
from pathlib import Path

from dashboard.observatory.derive.passes import PASSES

DOC = (Path(__file__).resolve().parents[3] / "docs" / "derivations.md").read_text(encoding="utf-8")


def test_the_doc_lists_the_passes_in_the_order_they_run():
    in_table = re.findall(r"^\| \*\*(\w+)\*\* \(`(\w+)\.py`\)", DOC, re.M)
    assert in_table == [(derivation.name, derivation.name) for derivation in PASSES]
    assert " ──► ".join(derivation.name for derivation in PASSES) in DOC


def test_every_pass_declares_what_it_reads_and_writes():
    for derivation in PASSES:
        assert derivation.reads and derivation.writes, derivation.name
