"""Aggregate order rows into revenue by region and product."""


def summarise(rows):
    totals = {}
    for row in rows:
        key = (row["region"], row["product"])
        totals[key] = totals.get(key, 0) + row["quantity"] * row["unit_price"]
    return totals
