"""``deliver``'s Delta target when another delivery commits between its read and its commit.

An attempt whose Celery worker was lost keeps running on its job host until it ends, so it
can merge into ``delivered`` while the retry of another epoch does: each merge then finds a
version it did not read. The conflict here is real (a second writer's commit lands between
the snapshot and the merge); only its timing is chosen.
"""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from falkirk.spark_jobs.sampled import targets as targets_module
from falkirk.spark_jobs.sampled.targets import DELTA, SampleTable, SampleTargets


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
