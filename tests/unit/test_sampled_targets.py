"""``deliver``'s targets when another delivery writes at the same time.

An attempt whose Celery worker was lost keeps running on its job host until it ends, so it
can merge into ``delivered`` while the retry of another epoch does: each merge then finds a
version it did not read. And it can keep delivering its epoch after a newer delivery of the
same epoch began (its retry, or a recovery's redo of rows drawn again): the newer one fences
it off. The conflicts here are real (a second writer's commit lands between the snapshot and
the merge; two deliveries of one epoch on one SQLite file and one Delta table); only their
timing is chosen.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from falkirk.spark_jobs.sampled import targets as targets_module
from falkirk.spark_jobs.sampled.targets import DELTA, SampleTable, SampleTargets, Superseded


def _rows(epoch: int, *keys: str) -> pa.Table:
    return pa.Table.from_pylist([{"epoch": epoch, "key": k, "value": 1, "chunk": 1, "delivery": "0.1",
                                  "committed_at": 0.0} for k in keys], schema=DELTA)


def test_a_merge_that_meets_another_deliverys_commit_is_run_again(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    uri = str(tmp_path / "delivered")
    write_deltalake(uri, _rows(17, "17-1"), mode="error")
    stale = DeltaTable(uri)  # this delivery's read ...
    write_deltalake(uri, _rows(18, "18-1"), mode="append")  # ... then another epoch's delivery commits
    opened: list[int] = []

    def open_table(u: str) -> DeltaTable | None:
        opened.append(1)
        return stale if len(opened) == 1 else DeltaTable(u)

    monkeypatch.setattr(targets_module, "open_table", open_table)
    target = SampleTargets(SampleTable(str(tmp_path / "s.sqlite")), uri)
    target.commit(17, "1.2", [{"key": "17-1", "value": 7, "chunk": 1}, {"key": "17-2", "value": 8, "chunk": 1}])

    assert len(opened) == 2  # the first merge lost the race and was read and run again
    table = DeltaTable(uri).to_pyarrow_table().to_pylist()
    rows = sorted((r["epoch"], r["key"], r["value"], r["delivery"]) for r in table)
    assert rows == [(17, "17-1", 7, "1.2"), (17, "17-2", 8, "1.2"), (18, "18-1", 1, "0.1")]


def test_a_first_batch_that_finds_the_table_created_meanwhile_merges_into_it(
        tmp_path, monkeypatch) -> None:  # noqa: ANN001
    uri = str(tmp_path / "delivered")
    seen: list[int] = []

    def open_table(u: str) -> DeltaTable | None:
        seen.append(1)
        if len(seen) == 1:  # not there when read; another delivery creates it before this one does
            write_deltalake(u, _rows(17, "17-1"), mode="error")
            return None
        return DeltaTable(u)

    monkeypatch.setattr(targets_module, "open_table", open_table)
    target = SampleTargets(SampleTable(str(tmp_path / "s.sqlite")), uri)
    target.commit(17, "1.2", [{"key": "17-1", "value": 7, "chunk": 1}])

    rows = [(r["epoch"], r["key"], r["value"]) for r in DeltaTable(uri).to_pyarrow_table().to_pylist()]
    assert rows == [(17, "17-1", 7)]


ROWS_OF_THE_REDO = [{"key": "7-2", "value": 2500, "chunk": 1}, {"key": "7-3", "value": 3100, "chunk": 2}]


def _both(target: SampleTargets) -> tuple[list[tuple], list[tuple]]:
    delta = sorted((r["epoch"], r["key"], r["value"], r["chunk"]) for r in target.delta_rows())
    return target.sql.rows(), delta


def test_an_older_delivery_that_lives_on_cannot_write_over_a_newer_one(tmp_path) -> None:  # noqa: ANN001
    """deliver of epoch 7 (incarnation 0, try 1) lives on after its worker was lost, while a
    recovery redid draw's epoch 7 (other rows) and deliver's redo delivered them: the old
    attempt's next batch, and its closing trim, are refused, and both targets keep the redo's rows."""
    uri, path = str(tmp_path / "delivered"), str(tmp_path / "s.sqlite")
    old, new = (SampleTargets(SampleTable(path), uri) for _ in range(2))
    old.commit(7, "0.1", [{"key": "7-1", "value": 1042, "chunk": 1}, {"key": "7-2", "value": 2042, "chunk": 1}])
    new.commit(7, "1.2", ROWS_OF_THE_REDO)
    assert new.finish(7, "1.2", {"7-2", "7-3"}) == 1
    with pytest.raises(Superseded, match="delivery 0.1 of epoch 7 is refused: delivery 1.2 of that epoch has begun"):
        old.commit(7, "0.1", [{"key": "7-4", "value": 4042, "chunk": 2}])
    with pytest.raises(Superseded):
        old.finish(7, "0.1", {"7-1", "7-2", "7-4"})
    want = [(7, "7-2", 2500, 1), (7, "7-3", 3100, 2)]
    assert _both(new) == (want, want)
    # a retry of the redo (a later try) takes over from it as it did from the first
    new.commit(7, "1.3", ROWS_OF_THE_REDO)
    assert new.sql.transactions(7)[-1][1] == "1.3"


def test_a_newer_delivery_begins_only_once_a_batch_in_flight_is_in_both_targets(
        tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The old attempt's batch has reached SQL and is merging into Delta (slowly: S3 stalls)
    when the redo begins: the redo waits for that batch to be in both targets, so its trim
    removes the batch's stale row from both, and neither target is left with it."""
    uri, path = str(tmp_path / "delivered"), str(tmp_path / "s.sqlite")
    old, new = (SampleTargets(SampleTable(path), uri) for _ in range(2))
    old.commit(7, "0.1", [{"key": "7-1", "value": 1042, "chunk": 1}])
    merging, go_on = threading.Event(), threading.Event()
    merge = SampleTargets._merge

    def slow_merge(self: SampleTargets, batch: pa.Table) -> None:
        if self is old:
            merging.set()
            go_on.wait(30)
        merge(self, batch)

    monkeypatch.setattr(SampleTargets, "_merge", slow_merge)
    stale = threading.Thread(target=old.commit, args=(7, "0.1", [{"key": "7-4", "value": 4042, "chunk": 2}]))
    stale.start()
    assert merging.wait(30)
    redo_done: list[float] = []

    def redo() -> None:
        new.commit(7, "1.2", ROWS_OF_THE_REDO)
        new.finish(7, "1.2", {"7-2", "7-3"})
        redo_done.append(time.monotonic())

    redoing = threading.Thread(target=redo)
    redoing.start()
    time.sleep(1.0)
    assert redo_done == []  # held back while the old batch is in flight
    released = time.monotonic()
    go_on.set()
    stale.join(30)
    redoing.join(30)
    assert redo_done and redo_done[0] > released
    want = [(7, "7-2", 2500, 1), (7, "7-3", 3100, 2)]
    assert _both(new) == (want, want)
