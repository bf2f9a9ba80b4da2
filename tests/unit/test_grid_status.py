"""The grid's scratch cells: kept, collected (deleted by garbage collection: no reader needs them)
or lost (deleted by anything else), as the Falkirk view shows them."""

from __future__ import annotations

import json

from falkirk.plugins.grid_status import grid_from_rows


def _rows(epochs: int) -> dict[str, list]:
    out = [{"uri": "/s/d/source/output", "tier": "scratch"}]
    return {"dag_id": ["d"] * epochs, "task_id": ["source"] * epochs, "map_index": [-1] * epochs,
            "epoch": list(range(1, epochs + 1)), "incarnation": [0] * epochs, "run_id": [f"r{e}" for e in
                                                                                        range(1, epochs + 1)],
            "state_tier": [None] * epochs, "state_uri": [None] * epochs, "outputs": [json.dumps(out)] * epochs}


def test_a_scratch_cell_deleted_by_garbage_collection_is_collected_and_one_deleted_otherwise_is_lost() -> None:
    gone = {1, 2, 3, 4}  # epochs whose scratch output no longer holds the commit
    by_gc = {1, 2, 3}  # epochs the table's log says garbage collection deleted
    grid = grid_from_rows(["source"], _rows(5), collected_through={"source": 2},
                          readable=lambda uri, key: key.epoch not in gone,
                          collected=lambda uri, key: key.epoch in by_gc)
    # 1-2: collected ledger rows; 3: past the task's mark, its output collected; 4: lost; 5: kept
    assert grid.status == {"source": "GGGXS"}


def test_without_the_collections_log_a_gone_scratch_cell_is_lost() -> None:
    grid = grid_from_rows(["source"], _rows(2), readable=lambda uri, key: key.epoch != 2)
    assert grid.status == {"source": "SX"}
