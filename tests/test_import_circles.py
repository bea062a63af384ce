"""One direction: no module of dashboard/ or pipeline/ imports one that imports it back,
however far round.

Every import statement is an edge, function-level and ``if TYPE_CHECKING:`` ones too:
an import put off until a call still ties the two modules together for a reader, and
only hides the circle from the interpreter. Migrations are left out, and so is a
package's ``__init__`` importing its own modules (re-exporting them is what it is for).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dashboard", "pipeline")

# module -> {imported module: line of the first import statement that brings it}
Graph = dict[str, dict[str, int]]


def find_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module under the packages by its dotted name (a package by its own name)."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if "migrations" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imported_modules(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names one import statement asks for, relative ones made absolute.
    ``from pkg import name`` asks for ``pkg.name``: the module if there is one, else
    a name that ``pkg`` defines (``resolve`` falls back to ``pkg``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        # `from . import x` in a package's __init__ is relative to the package itself.
        here = module.split(".") if is_package else module.split(".")[:-1]
        base = here[: max(len(here) - (node.level - 1), 0)]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module or ""
    return [f"{stem}.{alias.name}" if stem else alias.name for alias in node.names]


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest leading part of ``name`` that is one of our modules, if any."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, packages: tuple[str, ...]) -> Graph:
    modules = find_modules(root, packages)
    graph: Graph = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in imported_modules(node, module, is_package):
                target = resolve(name, modules)
                if target is None or target == module:
                    continue
                if is_package and target.startswith(module + "."):
                    continue  # the package re-exporting its own modules
                edges[target] = min(edges.get(target, node.lineno), node.lineno)  # ast.walk is not in line order
        graph[module] = edges
    return graph


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's components of more than one module, each sorted, in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph.get(module, {}):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(components)


def a_way_round(graph: Graph, circle: list[str]) -> list[str]:
    """A shortest path from the circle's first module back to itself, inside the circle."""
    start, members = circle[0], set(circle)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for target in sorted(graph[module]):
            if target == start:
                path = [module]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target in members and target not in came_from:
                came_from[target] = module
                queue.append(target)
    raise AssertionError(f"{circle} is not a circle")


def describe(graph: Graph, circle: list[str]) -> str:
    """The circle's modules, then one way round it: each module with the line that
    imports the next (``a:12 → b:3 → a``)."""
    way = a_way_round(graph, circle)
    steps = [f"{module}:{graph[module][after]}" for module, after in zip(way, way[1:])]
    return f"circle of {len(circle)}: {', '.join(circle)}\n    e.g. {' → '.join([*steps, way[-1]])}"


def circles_under(root: Path, packages: tuple[str, ...]) -> list[str]:
    graph = import_graph(root, packages)
    return [describe(graph, circle) for circle in strongly_connected(graph)]


# --- the product ------------------------------------------------------------------------


def test_it_finds_no_import_circle_in_dashboard_or_pipeline() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert {"dashboard", "dashboard.settings", "pipeline", "pipeline._skills"} <= graph.keys()
    circles = [describe(graph, circle) for circle in strongly_connected(graph)]
    assert not circles, "import circles (a:12 → b: module a imports b on line 12):\n" + "\n".join(circles)


# --- the detector itself, on trees made for it ------------------------------------------


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_it_finds_a_circle_of_three_closed_by_a_function_level_import(tmp_path: Path) -> None:
    write(tmp_path, {
        "shop/__init__.py": "from .orders import Order\n",
        "shop/orders.py": "from shop.billing import invoices\n\nclass Order: ...\n",
        "shop/billing/__init__.py": "",
        "shop/billing/invoices.py": "import shop.stock\n",
        "shop/stock.py": "def reserve():\n    from .orders import Order\n    return Order\n",
        "shop/unrelated.py": "import os\nfrom shop.orders import Order\n",
        # a migration importing back is not looked at
        "shop/migrations/__init__.py": "",
        "shop/migrations/0001_initial.py": "from shop import unrelated\n",
    })

    graph = import_graph(tmp_path, ("shop",))

    assert "shop.migrations.0001_initial" not in graph
    assert graph["shop.orders"] == {"shop.billing.invoices": 1}  # `from pkg import module`: the module
    assert graph["shop.stock"] == {"shop.orders": 2}  # relative, inside a function
    assert strongly_connected(graph) == [["shop.billing.invoices", "shop.orders", "shop.stock"]]
    assert circles_under(tmp_path, ("shop",)) == [
        "circle of 3: shop.billing.invoices, shop.orders, shop.stock\n"
        "    e.g. shop.billing.invoices:1 → shop.stock:2 → shop.orders:1 → shop.billing.invoices"
    ]


def test_it_finds_a_circle_through_type_checking_imports(tmp_path: Path) -> None:
    write(tmp_path, {
        "app/__init__.py": "",
        "app/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.b import B\n",
        "app/b.py": "from . import a\n",
    })

    assert strongly_connected(import_graph(tmp_path, ("app",))) == [["app.a", "app.b"]]


def test_it_finds_no_circle_when_imports_go_one_way(tmp_path: Path) -> None:
    write(tmp_path, {
        # the package re-exports its modules, which import from it and from each other one way
        "shop/__init__.py": (
            "from . import orders\nfrom .stock import reserve\nfrom .billing.invoices import bill\n\nNAME = 'shop'\n"
        ),
        "shop/orders.py": "from shop import stock\n\ndef order():\n    from .billing import invoices\n",
        "shop/billing/__init__.py": "from .invoices import bill\n",
        "shop/billing/invoices.py": "from shop import stock\nfrom shop.stock import reserve\n\ndef bill(): ...\n",
        "shop/stock.py": "import json\nfrom shop import errors\n\ndef reserve(): ...\n",
        "shop/errors.py": "from shop import NAME\n",  # a name the package defines: an edge to it
    })

    graph = import_graph(tmp_path, ("shop",))

    assert graph["shop"] == {} and graph["shop.billing"] == {}
    assert graph["shop.errors"] == {"shop": 1}
    assert graph["shop.orders"] == {"shop.stock": 1, "shop.billing.invoices": 4}
    assert strongly_connected(graph) == []
    assert circles_under(tmp_path, ("shop",)) == []
