"""What the demo pipeline's tables must hold, computed in plain Python from the source.

Independent of Spark and of the job runtime: it re-derives every row from
``orders_for_epoch`` (the pipeline's input) with dictionaries and sorting.
"""

from __future__ import annotations

from falkirk.spark_jobs.pipeline.source import orders_for_epoch

Rows = list[dict]


def expected_tables(epochs: list[int]) -> dict[str, Rows]:
    """Rows (with their ``epoch``) of ingest's output, aggregate's output and state, publish's output."""
    ingest: Rows = []
    agg_out: Rows = []
    agg_state: Rows = []
    publish: Rows = []
    totals: dict[str, tuple[int, int]] = {}
    for epoch in epochs:
        valid = [dict(r, epoch=epoch) for r in orders_for_epoch(epoch) if r["amount"] > 0]
        ingest += valid
        this: dict[str, tuple[int, int]] = {}
        for r in valid:
            amount, count = this.get(r["customer"], (0, 0))
            this[r["customer"]] = (amount + r["amount"], count + 1)
        for customer in set(totals) | set(this):
            prev_amount, prev_count = totals.get(customer, (0, 0))
            amount, count = this.get(customer, (0, 0))
            totals[customer] = (prev_amount + amount, prev_count + count)
            agg_out.append({"customer": customer, "epoch_amount": amount, "epoch_orders": count,
                            "total_amount": totals[customer][0], "total_orders": totals[customer][1],
                            "epoch": epoch})
            agg_state.append({"customer": customer, "total_amount": totals[customer][0],
                              "total_orders": totals[customer][1], "epoch": epoch})
        ranked = sorted(totals.items(), key=lambda kv: (-kv[1][0], kv[0]))
        publish += [{"rank": i + 1, "customer": c, "total_amount": a, "total_orders": n, "epoch": epoch}
                    for i, (c, (a, n)) in enumerate(ranked)]
    return {"ingest/output": ingest, "aggregate/output": agg_out, "aggregate/state": agg_state,
            "publish/output": publish}


def canonical(rows: Rows) -> list[tuple]:
    """Rows as sorted tuples of sorted items: order-insensitive, exact on values (nulls sort first)."""
    return sorted((tuple(sorted(r.items())) for r in rows),
                  key=lambda row: tuple((k, v is not None, v if v is not None else 0) for k, v in row))
