"""The demo's scripted conversations, in English and Chinese. Together they show every
kind of event the dashboard displays: errors of each type, retries, cache hits, large
results stored as artifacts, skills (nested, refused, cyclic) and compressions."""

from __future__ import annotations

import json
import re

from .model import Call, RoundScript, Scenario, last_artifact_id, newest_match

REVENUE_BY_REGION = (
    "SELECT region, ROUND(SUM(revenue), 2) AS revenue, "
    "ROUND(SUM(SUM(revenue)) OVER (), 2) AS total FROM orders GROUP BY region ORDER BY revenue DESC"
)
# The names the Chinese answers give the regions (as the corpus writes them).
REGION_ZH = {"East": "华东", "South": "华南", "North": "华北", "West": "西部"}
_ROW = re.compile(r"^\s*- (\{.*\})\s*$", re.MULTILINE)
_RESULT = re.compile(r'"result": (-?\d+(?:\.\d+)?)')
_STORED = re.compile(r"Data stored as artifact: (\S+)[\s\S]*?List with (\d+) items")

# Every figure an answer states is read from what the tools returned in this
# conversation (the observations, newest last), as a model would: never written
# into the script, so the answer cannot disagree with the query result beside it.


def _rows(observations: list[str], key: str) -> list[dict[str, object]]:
    """The rows with ``key`` of the newest observation that lists any (the
    STANDARD preview writes one ``- {json}`` line per row it shows)."""
    for text in reversed(observations):
        rows = []
        for line in _ROW.findall(text):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and key in row:
                rows.append(row)
        if rows:
            return rows
    return []


def _first_rows(observations: list[str]) -> str:
    """The first row of the newest observation, quoted as a model would paraphrase it."""
    text = observations[-1] if observations else ""
    rows = _ROW.findall(text)
    if rows:
        try:
            row = json.loads(rows[0])
            if "snippet" in row:  # a search hit: what it says, and where
                return f"{row['snippet']} ({row.get('title', '')})"[:200]
            return ", ".join(f"{k} {v}" for k, v in row.items())[:160]
        except (ValueError, AttributeError, TypeError):
            return rows[0][:160]
    return text.splitlines()[0][:160] if text else "no data"


def _calculated(observations: list[str]) -> str:
    """The calculator's result in the newest observation that has one."""
    return newest_match(observations, _RESULT, "?", group=1)


def _leader(observations: list[str]) -> dict[str, object]:
    """The region with the most revenue in the region query's result."""
    rows = _rows(observations, "region")
    return max(rows, key=lambda row: float(row.get("revenue") or 0)) if rows else {"region": "?", "revenue": 0}


def _share_expression(observations: list[str]) -> dict[str, str]:
    # The leading region's revenue over the total of every region (the query's
    # all_regions column: its preview shows three of the four regions).
    leader = _leader(observations)
    return {"expression": f"round({leader['revenue']} / {leader.get('total', 0)} * 100, 1)"}


def _review(observations: list[str]) -> str:
    """The quarterly review from the two queries' results; a result the model saw
    only as a count (BRIEF, when the context is nearly full) gives no figure."""
    leader = _leader(observations)
    categories = _rows(observations, "category")  # ordered by revenue, largest first
    lines = [f"Quarterly review: {leader['region']} leads revenue ({float(leader['revenue']):,.2f})"]
    if categories:
        lines.append(f"{categories[0]['category']} is the largest category")
    return "; ".join(lines) + f". Recommended action: stock {leader['region']} ahead of the holiday season."


def _led_revenue(observations: list[str]) -> str:
    leader = _leader(observations)
    return f"{leader['region']} led revenue last year with {float(leader['revenue']):,.2f}."


def _stored(observations: list[str], what: str) -> str:
    """An answer about a result too large to show: where it is and how many rows."""
    own = getattr(observations, "this_round", observations)
    found = _STORED.search(own[-1]) if own else None
    if found is None:
        if not own:  # summarised away before it was read: say so, name no figure
            return f"{what}: the result was summarised before I read it; it is on the tool call above."
        return f"{what}: {_first_rows(own)}"
    return f"{what}: {int(found.group(2)):,} rows, stored as {found.group(1)} (preview it on the artifacts page)."


def _stored_rows(observations: list[str]) -> str:
    for text in observations:
        found = _STORED.search(text)
        if found:
            return f"{int(found.group(2)):,}"
    return "?"


def skill(name: str, level: int = 2, thought: str = "") -> Call:
    """Skill activation is a tool call the agent itself handles (as Claude Code's Skill tool)."""
    return Call("Skill", {"name": name, "level": level}, thought=thought or f"Load the {name} skill.")


SCENARIOS: list[Scenario] = [
    Scenario("revenue_by_region", "en", [
        RoundScript(
            "Which region had the highest revenue last year?",
            [Call("query_database", {"sql": REVENUE_BY_REGION}, thought="Aggregate revenue by region in SQL.")],
            _led_revenue,
        ),
        RoundScript(
            "What share of total revenue is that?",
            [Call("calculator", _share_expression, thought="The leading region's revenue over all regions' total.")],
            lambda obs: f"{_leader(obs)['region']} brought in {_calculated(obs)}% of total revenue.",
        ),
        RoundScript(
            "Show me the revenue by region once more, briefly.",
            [Call("query_database", {"sql": REVENUE_BY_REGION}, thought="Same query as before; the cache should answer.")],
            lambda obs: "Same figures as before: " + ", ".join(
                f"{row['region']} {float(row['revenue']):,.2f}" for row in _rows(obs, "region")) + ".",
        ),
    ]),
    Scenario("zh_region_skill", "zh", [
        RoundScript(
            "去年哪个地区的销售额最高？占比多少？",
            [
                skill("sales-analysis", thought="这是销售数据问题，先加载 sales-analysis 技能。"),
                Call("query_database", {"sql": REVENUE_BY_REGION}, thought="按地区汇总销售额。"),
                Call("calculator", _share_expression, thought="计算销售额最高地区的占比。"),
            ],
            lambda obs: (f"{REGION_ZH.get(str(_leader(obs)['region']), _leader(obs)['region'])}地区去年销售额最高，"
                         f"占总销售额的 {_calculated(obs)}%。"),
        ),
        RoundScript(
            "华东地区的需求为什么增长这么快？",
            [Call(
                "vector_search", {"query": "华东地区 需求 增长"}, thought="查找市场背景资料。",
                on_error=Call("Skill", {"name": "market-research", "level": 2},
                              thought="sales-analysis 技能不允许 vector_search，切换到 market-research 技能。"),
            ),
             Call("vector_search", {"query": "华东地区 需求 增长"}, thought="重新检索。")],
            lambda obs: f"根据检索结果：{_first_rows(obs)}",
        ),
    ]),
    Scenario("export_orders", "en", [
        RoundScript(
            "Export all 2025 orders for the finance team.",
            [Call("query_database", {"sql": "SELECT * FROM orders WHERE order_date >= '2025-01-01' ORDER BY id", "limit": 20000},
                  thought="The user wants the full data set: ask for FULL output so it is stored as an artifact.",
                  output_level="full")],
            lambda obs: f"The export is ready as {last_artifact_id(obs)}; finance can download it from the artifacts page.",
        ),
        RoundScript(
            "How big is that file, roughly?",
            [Call("file_reader", lambda obs: {"name": last_artifact_id(obs)}, thought="Read the artifact back to check it.",
                  output_level="brief")],
            lambda obs: f"It holds {_stored_rows(obs)} orders, every order of 2025, as JSON.",
        ),
    ]),
    Scenario("timeout_then_aggregate", "en", [
        RoundScript(
            "Count every pair of orders so we can estimate co-purchases.",
            [Call("query_database", {"sql": "SELECT COUNT(*) AS pairs FROM orders a, orders b WHERE a.customer_id = b.customer_id + 0 * b.id OR a.region = b.region"},
                  thought="A self-join over all orders.", timeout_ms=400,
                  on_error=Call("query_database",
                                {"sql": "SELECT customer_id, COUNT(*) AS n FROM orders GROUP BY customer_id ORDER BY n DESC LIMIT 20"},
                                thought="The self-join timed out; count orders per customer instead."))],
            lambda obs: f"The full pair count is too slow, so here are the customers with most orders: {_first_rows(obs)}",
        ),
    ]),
    Scenario("invalid_sql_fixed", "en", [
        RoundScript(
            "What is the average discount by product category?",
            [Call("query_database",
                  {"sql": "SELECT category, AVG(discount_rate) FROM orders GROUP BY category"},
                  thought="Average the discount per category.",
                  on_error=Call("query_database",
                                {"sql": "SELECT p.category, ROUND(AVG(o.discount), 3) AS avg_discount FROM orders o "
                                        "JOIN products p ON p.id = o.product_id GROUP BY p.category ORDER BY avg_discount DESC"},
                                thought="Wrong column: category lives in products and the column is discount. Join."))],
            lambda obs: f"Average discount by category: {_first_rows(obs)}",
        ),
    ]),
    Scenario("missing_report", "en", [
        RoundScript(
            "Summarise the Q4 report for me.",
            [Call("file_reader", {"name": "q4_report.md"}, thought="Open the Q4 report.",
                  on_error=Call("file_reader", {"name": "q3_report.md"},
                                thought="There is no Q4 report yet; the latest is Q3."))],
            lambda obs: "There is no Q4 report yet. The Q3 report says: East and South above plan, West below; "
                        "actions: rebalance inventory, bundle promotion, review small-order fees.",
        ),
    ]),
    Scenario("throttled_search", "en", [
        RoundScript(
            "What do analysts expect for retail sales next quarter?",
            [Call("web_search", {"query": "retail sales outlook next quarter"}, thought="Search the news.",
                  fault="rate_limit_once")],
            lambda obs: f"Analysts expect growth of about 3.2 percent. {_first_rows(obs)}",
        ),
        RoundScript(
            "And how are electronics prices moving?",
            [Call("web_search", {"query": "electronics prices"}, thought="Search for price news.")],
            lambda obs: "Laptop and monitor prices fell about 6 percent year over year as supply recovered.",
        ),
    ]),
    Scenario("quarterly_review_nested", "en", [
        RoundScript(
            "Write a short quarterly business review.",
            [
                skill("quarterly-review", thought="A review combines two skills; load the review skill first."),
                skill("sales-analysis", thought="Nested: the review uses sales-analysis for the numbers."),
                Call("query_database", {"sql": REVENUE_BY_REGION}, thought="Revenue by region."),
                skill("quarterly-review", thought="Try to re-enter the review skill (this would be a cycle)."),
                Call("query_database", {"sql": "SELECT p.category, ROUND(SUM(o.revenue), 2) AS revenue FROM orders o JOIN products p "
                                               "ON p.id = o.product_id GROUP BY p.category ORDER BY revenue DESC"},
                     thought="Revenue by category."),
            ],
            _review,
        ),
    ]),
    Scenario("zh_pricing_policy", "zh", [
        RoundScript(
            "定价政策里关于折扣有什么规定？",
            [Call("file_reader", {"name": "pricing_policy.txt"}, thought="读取定价政策文件。")],
            "折扣超过百分之二十五需要地区经理批准；价格调整须提前七天通知客户。",
        ),
        RoundScript(
            "客户终身价值怎么计算？",
            [Call("vector_search", {"query": "客户终身价值 计算"}, thought="在资料库中检索定义。")],
            lambda obs: f"客户终身价值 = 平均订单金额 × 购买频率 × 预期客户生命周期，再减去获客成本。来源：{_first_rows(obs)}",
        ),
    ]),
    Scenario("growth_division_error", "en", [
        RoundScript(
            "What was revenue growth for the new Online region versus last year?",
            [Call("calculator", {"expression": "(120000 - 0) / 0 * 100"}, thought="Growth = (this year - last year) / last year.")],
            "Growth can't be computed: the Online region had no revenue last year (division by zero).",
        ),
    ]),
    Scenario("long_analysis", "en", [
        RoundScript(
            f"Give me the monthly revenue for the {region} region.",
            [Call("query_database",
                  {"sql": f"SELECT substr(order_date, 1, 7) AS month, ROUND(SUM(revenue), 2) AS revenue, COUNT(*) AS orders "
                          f"FROM orders WHERE region = '{region}' GROUP BY month ORDER BY month", "limit": 12},
                  thought=f"Monthly totals for {region}.", output_level="full")],
            lambda obs, region=region: _stored(obs, f"{region} monthly revenue"),
        )
        for region in ("East", "South", "North", "West")
    ] + [
        RoundScript(
            "List the top 40 customers by revenue with their regions.",
            [Call("query_database",
                  {"sql": "SELECT c.name, c.region, ROUND(SUM(o.revenue), 2) AS revenue FROM orders o JOIN customers c "
                          "ON c.id = o.customer_id GROUP BY c.id ORDER BY revenue DESC LIMIT 40", "limit": 40},
                  thought="Top customers.", output_level="full")],
            lambda obs: _stored(obs, "The top 40 customers by revenue"),
        ),
        RoundScript(
            "Which products sell best in each region?",
            [Call("query_database",
                  {"sql": "SELECT o.region, p.name, SUM(o.quantity) AS units FROM orders o JOIN products p ON p.id = o.product_id "
                          "GROUP BY o.region, p.name ORDER BY o.region, units DESC", "limit": 64},
                  thought="Units by region and product.", output_level="full")],
            lambda obs: _stored(obs, "Units sold by region and product"),
        ),
    ]),
]


def scenario_for(index: int) -> Scenario:
    """Conversations cycle through the scenarios in a fixed order."""
    return SCENARIOS[index % len(SCENARIOS)]


def describe() -> str:
    return json.dumps([{"key": s.key, "language": s.language, "rounds": len(s.rounds)} for s in SCENARIOS], ensure_ascii=False)
