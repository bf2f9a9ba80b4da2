"""What a consumer DAG's ledger rows say about the producer epochs they read through Assets:
the rows round-trip through the ledger table, and the planner reads edges and stale reads off them."""

from __future__ import annotations

import json
from pathlib import Path

from falkirk.policies.planning.assets import asset_edges, stale_reads
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import AssetInput, InputRef, Ledger, LedgerEntry

ASSET = "orders.ranking"


def _read(k: int, *reads: tuple[int, int], task: str = "leaders", map_index: int = -1) -> LedgerEntry:
    return LedgerEntry(dag_id="leaders", task_id=task, epoch=k, regime="eager_checkpoint", run_id=f"asset_triggered__{k}", try_number=1, map_index=map_index,
                       inputs=(InputRef(task_id="prepare", output="output", through=k),),
                       asset_inputs=tuple(AssetInput(asset=ASSET, dag_id="orders", task_id="publish", output="output", epoch=e, incarnation=i) for e, i in reads))


def test_asset_inputs_round_trip_through_the_ledger_table_beside_the_dags_own_inputs(tmp_path: Path) -> None:
    ledger = Ledger(StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch")))
    row = _read(2, (3, 1), (4, 0))
    partitioned = LedgerEntry(dag_id="leaders", task_id="by_region", epoch=2, regime="eager_checkpoint", run_id="r", try_number=1, asset_inputs=(
        AssetInput(asset=ASSET, dag_id="orders", task_id="publish", output="output", epoch=2, incarnation=0, map_index=1),))
    for entry in (row, partitioned, _read(3)):
        ledger.append(entry)
    back = {(e.task_id, e.epoch, e.map_index): e for e in ledger.entries("leaders")}
    assert back["leaders", 2, -1].asset_inputs == row.asset_inputs
    assert back["leaders", 2, -1].inputs == row.inputs  # the DAG's own inputs alone, as the planner reads them
    assert back["leaders", 3, -1].asset_inputs == ()
    assert back["by_region", 2, -1].asset_inputs == partitioned.asset_inputs  # read producer partition 1
    # a row without asset inputs is written exactly as before they existed
    assert json.loads(_read(3).to_row()["inputs"]) == [{"output": "output", "task_id": "prepare", "through": 3}]
    assert json.loads(partitioned.to_row()["inputs"]) == [
        {"asset": ASSET, "dag_id": "orders", "epoch": 2, "map_index": 1, "output": "output", "task_id": "publish"}]


def test_edges_gather_every_epoch_a_run_read_over_partitions() -> None:
    rows = [_read(1, (1, 0), (2, 0), map_index=0), _read(1, (2, 0), map_index=1), _read(2, (3, 0)), _read(3)]
    [edge] = asset_edges(rows)
    assert edge.consumed == {1: (1, 2), 2: (3,)}
    assert edge.stale_runs({"publish": (2, 3)}) == (1, 2)


def test_a_read_is_stale_once_its_producer_epoch_is_redone_or_rolled_back_and_not_yet_redone() -> None:
    producer = [LedgerEntry(dag_id="orders", task_id="publish", epoch=e, regime="batch(log_outputs=true)", run_id=f"epoch-{e}", try_number=1, incarnation=i)
                for e, i in ((1, 0), (2, 2), (4, 0))]  # epoch 3 rolled back, not yet redone
    rows = [_read(1, (1, 0)), _read(2, (2, 1)), _read(3, (3, 0)), _read(4, (4, 0)), _read(5, (2, 2))]
    assert [(row.epoch, read.epoch, read.incarnation) for row, read in stale_reads(rows, producer)] == [
        (2, 2, 1), (3, 3, 0)]


def test_garbage_collection_keeps_whole_an_output_another_dag_read_through_an_asset(tmp_path: Path) -> None:
    from falkirk.policies.planning.chains import DataEdge, TaskGraph
    from falkirk.policies.planning.collector import plan_collection
    from falkirk.policies.store.ledger import OutputRef

    # orders: publish (batch, logged) -> audit (eager, durable each epoch): audit never re-runs
    # epochs 1-6, so publish's epochs 1-6 may go, unless leaders (another DAG) has read them
    # through the Asset: a recovery there reads them again.
    def row(task: str, e: int, regime: str, state: str | None = None, inputs: tuple = ()) -> LedgerEntry:
        return LedgerEntry(dag_id="orders", task_id=task, epoch=e, regime=regime, run_id=f"epoch-{e}", try_number=1, state_uri=state, notified_through=e,
                           outputs=(OutputRef("output", f"/durable/orders/{task}/output", "durable", e, 1),),
                           inputs=tuple(InputRef(task_id=t, output="output", through=e) for t in inputs))
    rows = [row("publish", e, "batch(log_outputs=true)") for e in range(1, 7)]
    rows += [row("audit", e, "eager_checkpoint", "/durable/orders/audit/state", ("publish",)) for e in range(1, 7)]
    graph = TaskGraph(("publish", "audit"), (DataEdge("publish", "output", "audit"),))
    live = lambda uri: {e: 10 for e in range(1, 7)}  # noqa: E731
    alone = plan_collection("orders", rows, graph, lambda uri, key: True, live)
    assert {(r.task_id, r.what): r.epochs for r in alone.tables}[("publish", "output")] == (1, 2, 3, 4, 5, 6)

    ledger = Ledger(StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch")))
    for entry in (*rows[:2], _read(1, (1, 0)), _read(2, (2, 0)),
                  LedgerEntry(dag_id="audit_copy", task_id="copy", epoch=1, regime="batch", run_id="r", try_number=1, asset_inputs=(
                      AssetInput(asset="orders.audit", dag_id="orders", task_id="audit", output="output", epoch=1, incarnation=0, map_index=2),))):
        ledger.append(entry)
    readers = ledger.asset_readers("orders")
    assert readers == {("audit[2]", "output"): ["audit_copy"], ("publish", "output"): ["leaders"]}
    assert ledger.asset_readers("leaders") == {}
    kept = plan_collection("orders", rows, graph, lambda uri, key: True, live, asset_readers=readers)
    assert ("publish", "output") not in {(r.task_id, r.what) for r in kept.tables}
    assert [(p.task_id, p.output, p.why) for p in kept.products] == [
        ("publish", "output", "read through an Asset by leaders"), ("audit", "output", "read by no task of the DAG")]
    assert kept.watermarks == alone.watermarks and kept.marks == alone.marks  # only what is deleted differs
