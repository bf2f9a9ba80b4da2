"""An epoch's files written by the driver (small epochs) or by the executors (large ones):
the same rows, one Delta commit either way, and the switch falls exactly at the limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from falkirk.policies.store.commits import CommitKey, open_table, scan
from falkirk.spark_jobs.delta_sink import INLINE_MAX_ROWS, commit_frame

ROWS = 50


def _epoch_files(uri: str, epoch: int) -> list[str]:
    return open_table(uri).file_uris(file_pruning_predicate=[("epoch", "=", str(epoch))])


@pytest.mark.parametrize("limit, writer", [(ROWS, "driver"), (ROWS - 1, "executors"), (0, "executors")])
def test_both_writers_commit_the_same_rows(spark, tmp_path: Path, limit: int, writer: str) -> None:
    from falkirk.spark_jobs.delta_sink import publish, stage

    frame = spark.range(ROWS).selectExpr("id as item", "id * 3 as clicks").repartition(2)
    uri = str(tmp_path / "table")
    key = CommitKey(dag_id="sink", task_id="t", epoch=4, map_index=-1, incarnation=1)
    result = publish(stage(frame, uri, key, driver_write_max_rows=limit))

    table = open_table(uri)
    assert result.applied and result.rows == ROWS and table.version() == 0
    assert sorted((r["item"], r["clicks"], r["epoch"]) for r in scan(table).to_pylist()) == \
        [(i, 3 * i, 4) for i in range(ROWS)]
    files = _epoch_files(uri, 4)
    assert len(files) == (1 if writer == "driver" else 2)  # one file per non-empty partition


def test_an_empty_epoch_commits_no_file_and_a_second_commit_changes_nothing(spark, tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    empty = spark.createDataFrame([], "item long")
    first = commit_frame(empty, uri, CommitKey(dag_id="sink", task_id="t", epoch=1, map_index=-1, incarnation=1))
    again = commit_frame(spark.range(3).selectExpr("id as item"), uri, CommitKey(dag_id="sink", task_id="t", epoch=1, map_index=-1, incarnation=1))
    assert (first.applied, first.rows) == (True, 0) and not again.applied
    assert open_table(uri).version() == 0 and _epoch_files(uri, 1) == []


def test_epochs_racing_to_create_the_table_both_commit_once(spark, tmp_path: Path, monkeypatch) -> None:
    """Two first epochs both find no table and both try to create it: the loser commits into
    the winner's table. The loser's view is forced stale, so the race is hit every time."""
    import falkirk.policies.store.commits as commits
    import falkirk.spark_jobs.delta_sink as sink

    uri = str(tmp_path / "table")
    keys = [CommitKey(dag_id="sink", task_id="t", epoch=epoch, map_index=-1, incarnation=0) for epoch in (1, 2)]
    staged = [sink.stage(spark.range(3).selectExpr(f"id + {10 * k.epoch} as item"), uri, k) for k in keys]
    assert all(s.table is None for s in staged)  # neither saw a table
    assert sink.publish(staged[0]).applied

    real_open, calls = commits.open_table, []

    def stale_once(*args, **kwargs):
        calls.append(args[0])
        return None if len(calls) == 1 else real_open(*args, **kwargs)

    monkeypatch.setattr(commits, "open_table", stale_once)
    second = sink.publish(staged[1])
    assert len(calls) == 2 and second.applied  # created nothing; committed on the second look
    table = open_table(uri)
    assert table.version() == 1
    assert sorted((r["item"], r["epoch"]) for r in scan(table).to_pylist()) == \
        [(10, 1), (11, 1), (12, 1), (20, 2), (21, 2), (22, 2)]
    assert not sink.publish(sink.stage(spark.range(3).selectExpr("id as item"), uri, keys[1])).applied



def test_an_epoch_whose_table_changed_metadata_under_it_commits_on_a_second_look(
        spark, tmp_path: Path, monkeypatch) -> None:
    """Another writer changes the table's metadata between an epoch's last look and its
    commit. A single attempt is refused (publish commits with no silent retry by delta-rs,
    so a lost race is always seen), and publish looks again, finds its key absent, and
    commits once against the table as it is."""
    import falkirk.policies.store.commits as commits
    import falkirk.spark_jobs.delta_sink as sink

    uri = str(tmp_path / "table")
    assert sink.publish(sink.stage(spark.range(2).selectExpr("id as item"), uri, CommitKey(dag_id="sink", task_id="t", epoch=1))).applied
    real_check, looks = commits.already_committed, []

    def metadata_changes_after_the_first_look(table, key):
        looks.append(key.epoch)
        if len(looks) == 1:
            open_table(uri).alter.set_table_properties({"delta.logRetentionDuration": "interval 31 days"})
        return real_check(table, key)

    staged = sink.stage(spark.range(2).selectExpr("id + 20 as item"), uri, CommitKey(dag_id="sink", task_id="t", epoch=2))
    monkeypatch.setattr(commits, "already_committed", metadata_changes_after_the_first_look)
    with pytest.raises(Exception, match="Failed to commit transaction|Metadata changed"):
        sink.publish(staged, attempts=1)
    looks.clear()
    assert sink.publish(staged).applied and looks == [2, 2]
    table = open_table(uri)
    assert table.version() == 3  # epoch 1, two metadata changes, epoch 2
    assert sorted((r["item"], r["epoch"]) for r in scan(table).to_pylist()) == [(0, 1), (1, 1), (20, 2), (21, 2)]
    monkeypatch.undo()
    assert not sink.publish(sink.stage(spark.range(2).selectExpr("id as item"), uri, CommitKey(dag_id="sink", task_id="t", epoch=2))).applied


@pytest.mark.parametrize("rows, held", [(INLINE_MAX_ROWS + 1, True), (INLINE_MAX_ROWS, False)])
def test_rows_read_on_the_driver_are_handed_to_the_executors_once_above_the_limit(
        spark, tmp_path: Path, rows: int, held: bool, capsys) -> None:
    """A relation inlined in every later plan is sent and converted again by each query and
    persist; above the limit the executors hold it and plans name it (Scan ExistingRDD)."""
    from falkirk.spark_jobs.delta_sink import read_frame

    uri = str(tmp_path / "state")
    key = CommitKey(dag_id="sink", task_id="t", epoch=2, map_index=-1, incarnation=0)
    commit_frame(spark.range(rows).selectExpr("id as src", "id % 7 as rank"), uri, key)
    frame = read_frame(spark, uri, key, rows, on_driver=True)
    joined = frame.join(frame.selectExpr("src", "rank as again"), "src").persist()
    assert sorted((r["src"], r["rank"], r["again"]) for r in joined.collect()) == \
        [(i, i % 7, i % 7) for i in range(rows)]
    joined.unpersist()
    capsys.readouterr()
    frame.explain()
    plan = capsys.readouterr().out
    assert ("Scan ExistingRDD" in plan, "LocalTableScan" in plan) == (held, not held), plan
