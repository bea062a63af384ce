"""Real tools over the bundled business data: they do the work they say, so the demo
shows real latencies, real errors and real output sizes."""

from __future__ import annotations

import ast
import csv
import io
import math
import operator
import re
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

from .data import files_dir, web_corpus

_WORD = re.compile(r"[a-z0-9]+")
_CJK = re.compile(r"[\u4e00-\u9fff]")


def terms(text: str) -> list[str]:
    """Words for Latin text, character bigrams (and single characters) for Chinese."""
    lowered = text.lower()
    out = _WORD.findall(lowered)
    cjk = "".join(_CJK.findall(lowered))
    out.extend(cjk)
    out.extend(cjk[i : i + 2] for i in range(len(cjk) - 1))
    return out


class FaultInjector:
    """Makes a tool fail its next calls with a given exception, as a throttled or flaky
    remote service would. The demo's scenarios use it to show retries."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[BaseException] = []

    def fail_next(self, *errors: BaseException) -> None:
        with self._lock:
            self._pending.extend(errors)

    def clear(self) -> None:
        """Disarm what was not used (the call it was meant for was answered from a cache)."""
        with self._lock:
            self._pending.clear()

    def check(self) -> None:
        with self._lock:
            error = self._pending.pop(0) if self._pending else None
        if error is not None:
            raise error


class SalesDatabase:
    """Read-only SQL over the sales database. Only one SELECT statement; every write,
    attach or pragma is refused by an authorizer; a query is aborted after its deadline."""

    _ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}
    MAX_ROWS = 50_000

    def __init__(self, path: Path, *, deadline_seconds: float = 5.0) -> None:
        self.path = path
        self.deadline_seconds = deadline_seconds

    def _authorize(self, action: int, *args: Any) -> int:
        return sqlite3.SQLITE_OK if action in self._ALLOWED else sqlite3.SQLITE_DENY

    def query(self, sql: str, limit: int = 200) -> list[dict[str, Any]]:
        if not isinstance(sql, str) or not sql.strip():
            raise ValueError("sql must be a non-empty SELECT statement")
        if not isinstance(limit, int) or not 1 <= limit <= self.MAX_ROWS:
            raise ValueError(f"limit must be an integer from 1 to {self.MAX_ROWS}")
        statement = sql.strip().rstrip(";")
        if ";" in statement:
            raise ValueError("only one statement is allowed")
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        deadline = time.monotonic() + self.deadline_seconds
        db.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        db.set_authorizer(self._authorize)
        try:
            cursor = db.execute(statement)
            columns = [c[0] for c in cursor.description or ()]
            return [dict(zip(columns, row)) for row in cursor.fetchmany(limit)]
        except sqlite3.DatabaseError as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"query exceeded {self.deadline_seconds:g} s") from None
            raise ValueError(f"SQL error: {exc}") from None
        finally:
            db.close()


class Corpus:
    """The offline web corpus, searchable by keyword and by TF-IDF vector similarity."""

    def __init__(self, documents: tuple[dict[str, Any], ...]) -> None:
        self.documents = documents
        self._bags = [Counter(terms(d["title"] + " " + d["text"])) for d in documents]
        df = Counter(t for bag in self._bags for t in bag)
        n = len(documents)
        self._idf = {t: math.log((1 + n) / (1 + c)) + 1 for t, c in df.items()}
        self._vectors = [self._vector(bag) for bag in self._bags]

    def _vector(self, bag: Counter[str]) -> dict[str, float]:
        vec = {t: c * self._idf.get(t, 0.0) for t, c in bag.items()}
        norm = math.sqrt(sum(v * v for v in vec.values())) or 1.0
        return {t: v / norm for t, v in vec.items()}

    def keyword_search(self, query: str, top_k: int) -> list[dict[str, Any]]:
        wanted = set(terms(query))
        scored = [(sum(bag[t] for t in wanted), i) for i, bag in enumerate(self._bags)]
        hits = sorted((s, i) for s, i in scored if s > 0)[::-1][:top_k]
        return [self._hit(i, float(s)) for s, i in hits]

    def vector_search(self, query: str, top_k: int) -> list[dict[str, Any]]:
        q = self._vector(Counter(terms(query)))
        scored = [(sum(w * vec.get(t, 0.0) for t, w in q.items()), i) for i, vec in enumerate(self._vectors)]
        hits = sorted((s, i) for s, i in scored if s > 0)[::-1][:top_k]
        return [self._hit(i, round(s, 4)) for s, i in hits]

    def _hit(self, index: int, score: float) -> dict[str, Any]:
        doc = self.documents[index]
        return {"id": doc["id"], "title": doc["title"], "url": doc["url"], "snippet": doc["text"][:160], "score": score}


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.Pow: operator.pow, ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv}
_FUNCTIONS: dict[str, Callable[..., float]] = {"round": round, "abs": abs, "min": min, "max": max, "sqrt": math.sqrt}


def calculate(expression: str) -> float:
    """Evaluate arithmetic safely: numbers, + - * / // % **, parentheses, round/abs/min/max/sqrt."""
    if not isinstance(expression, str) or not expression.strip() or len(expression) > 500:
        raise ValueError("expression must be a non-empty string of at most 500 characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression[:80]!r}") from None

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            try:
                return _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ValueError("division by zero") from None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
            return _FUNCTIONS[node.func.id](*(ev(a) for a in node.args))
        raise ValueError(f"unsupported element in expression: {type(node).__name__}")

    return ev(tree)


def read_file(name: str, *, artifact_reader: Optional[Callable[[str], bytes]] = None) -> Any:
    """Read a bundled file by its name (CSV as rows, text as text), or a stored artifact by id."""
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a file name or an artifact id")
    if name.startswith("artifact_"):
        if artifact_reader is None:
            raise FileNotFoundError("no artifact store is configured")
        data = artifact_reader(name)  # validates the id and refuses anything outside the store
        return data.decode("utf-8", errors="replace")
    available = {p.name: p for p in files_dir().iterdir() if p.is_file()}
    if name not in available:  # only names listed in the folder: no path can reach elsewhere
        raise FileNotFoundError(f"no file named {name[:80]!r}; available: {', '.join(sorted(available))}")
    text = available[name].read_text(encoding="utf-8")
    if name.endswith(".csv"):
        return list(csv.DictReader(io.StringIO(text)))
    return text


class DemoTools:
    """The demo's tool set, bound to one sales database and one artifact reader."""

    def __init__(self, database_path: Path, *, artifact_reader: Optional[Callable[[str], bytes]] = None) -> None:
        self.database = SalesDatabase(database_path)
        self.corpus = Corpus(web_corpus())
        self.artifact_reader = artifact_reader
        self.search_faults = FaultInjector()

    def query_database(self, sql: str, limit: int = 200) -> list[dict[str, Any]]:
        return self.database.query(sql, limit)

    def file_reader(self, name: str) -> Any:
        return read_file(name, artifact_reader=self.artifact_reader)

    def web_search(self, query: str, top_k: int = 3) -> list[dict[str, Any]]:
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query must be a non-empty string")
        self.search_faults.check()
        return self.corpus.keyword_search(query, max(1, min(int(top_k), 10)))

    def vector_search(self, query: str, top_k: int = 3) -> list[dict[str, Any]]:
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query must be a non-empty string")
        return self.corpus.vector_search(query, max(1, min(int(top_k), 10)))

    def calculator(self, expression: str) -> dict[str, Any]:
        return {"expression": expression, "result": calculate(expression)}

    def as_dict(self) -> dict[str, Callable[..., Any]]:
        return {
            "query_database": self.query_database,
            "file_reader": self.file_reader,
            "web_search": self.web_search,
            "vector_search": self.vector_search,
            "calculator": self.calculator,
        }
