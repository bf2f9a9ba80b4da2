"""Tables of what the ledger and the Delta store hold, for people."""

from __future__ import annotations

from falkirk.policies.store.ledger import Ledger


def epoch_table(ledger: Ledger, dag_id: str, task_order: list[str] | None = None) -> str:
    """Epochs x tasks: the ledger rows of each (task, epoch) and the rows it committed.

    Each cell reads ``ledger rows / output rows (tier) / state rows``.
    """
    entries = ledger.entries(dag_id)
    tasks = task_order or sorted({e.task_id for e in entries})
    epochs = sorted({e.epoch for e in entries})
    cells: dict[tuple[int, str], list] = {}
    for e in entries:
        cells.setdefault((e.epoch, e.task_id), []).append(e)
    header = ["epoch"] + tasks
    rows = [header]
    for epoch in epochs:
        row = [str(epoch)]
        for task in tasks:
            found = cells.get((epoch, task), [])
            if not found:
                row.append("-")
                continue
            last = max(found, key=lambda e: e.incarnation)
            tier = ",".join(sorted({o.tier for o in last.outputs}))
            cell = f"{len(found)} row / out {last.output_rows} ({tier})"
            if last.state_rows is not None:
                cell += f" / state {last.state_rows}"
            row.append(cell)
        rows.append(row)
    regimes = {e.task_id: e.regime for e in entries}
    rows.insert(1, ["regime"] + [regimes.get(t, "?") for t in tasks])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(2, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
