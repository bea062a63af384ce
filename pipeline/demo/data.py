"""The demo's bundled business data: a SQLite sales database built deterministically
from a seed, an offline web corpus (English and Chinese) and a few internal files."""

from __future__ import annotations

import json
import random
import sqlite3
from datetime import date, timedelta
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

REGIONS = ("East", "South", "North", "West")
CATEGORIES = {
    "Electronics": [("Laptop", 899.0), ("Monitor", 229.0), ("Headphones", 79.0), ("Keyboard", 49.0)],
    "Home Goods": [("Sofa", 649.0), ("Lamp", 39.0), ("Rug", 119.0), ("Kettle", 29.0)],
    "Apparel": [("Jacket", 129.0), ("Sneakers", 89.0), ("T-shirt", 19.0), ("Scarf", 25.0)],
    "Grocery": [("Coffee beans", 14.0), ("Green tea 绿茶", 12.0), ("Olive oil", 11.0), ("Rice 大米", 9.0)],
}
SCHEMA = """
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL,
                       unit_price REAL NOT NULL);
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, region TEXT NOT NULL,
                        signup_date TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     product_id INTEGER NOT NULL REFERENCES products(id), region TEXT NOT NULL,
                     order_date TEXT NOT NULL, quantity INTEGER NOT NULL, discount REAL NOT NULL,
                     revenue REAL NOT NULL);
CREATE INDEX orders_date ON orders(order_date);
CREATE INDEX orders_region ON orders(region);
"""


def build_sales_database(path: Path, *, orders: int = 12_000, seed: int = 7) -> Path:
    """Write the sales database to ``path`` (replacing it). The same seed gives the same data."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    db = sqlite3.connect(tmp)
    try:
        db.executescript(SCHEMA)
        products = [
            (i, name, category, price)
            for i, (category, name, price) in enumerate(
                ((c, n, p) for c, items in CATEGORIES.items() for n, p in items), start=1
            )
        ]
        db.executemany("INSERT INTO products VALUES (?, ?, ?, ?)", products)
        first_names = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fang", "Gus", "Hana", "Ivo", "Jun", "Li", "Mei"]
        customers = []
        for i in range(1, 601):
            signup = date(2024, 1, 1) + timedelta(days=rng.randrange(600))
            customers.append((i, f"{rng.choice(first_names)} {i:03d}", rng.choice(REGIONS), signup.isoformat()))
        db.executemany("INSERT INTO customers VALUES (?, ?, ?, ?)", customers)
        weights = {"East": 4, "South": 3, "North": 2, "West": 1}
        rows = []
        for i in range(1, orders + 1):
            customer = customers[rng.randrange(len(customers))]
            product = products[rng.randrange(len(products))]
            region = rng.choices(REGIONS, weights=[weights[r] for r in REGIONS])[0]
            day = date(2025, 1, 1) + timedelta(days=rng.randrange(365))
            quantity = rng.randint(1, 5)
            discount = rng.choice((0.0, 0.0, 0.0, 0.05, 0.1, 0.2, 0.3))
            revenue = round(product[3] * quantity * (1 - discount), 2)
            rows.append((i, customer[0], product[0], region, day.isoformat(), quantity, discount, revenue))
        db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        db.commit()
    finally:
        db.close()
    tmp.replace(path)
    return path


def data_dir() -> Path:
    return Path(str(resources.files("pipeline.demo") / "data"))


@lru_cache(maxsize=1)
def web_corpus() -> tuple[dict[str, Any], ...]:
    with open(data_dir() / "corpus.json", encoding="utf-8") as handle:
        return tuple(json.load(handle))


def files_dir() -> Path:
    return data_dir() / "files"
