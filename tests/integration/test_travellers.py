"""Marker pairs on Spark: a non-deterministic producer, a SQLite sink committing while it runs.

:mod:`falkirk.spark_jobs.travellers`'s ``draw`` samples without a seed and streams each chunk
to the sink before saving it; ``deliver`` commits in transactions of at most 8 rows. Epoch 1:
``draw`` is SIGKILLed after sending chunk 3's rows and before saving them, and a new attempt
replays chunks 1-2 from their determinants and draws 3-4 again. Epoch 2, the negative control
with slow travellers only: the sink stalls with a full transaction. Epoch 3, the negative
control treating the task as deterministic: a new attempt draws everything again, and rows
the sink had already committed change. Last, downstream is lost (the edge, its control table,
the SQL database): ``draw`` sends epoch 1 again from its determinants, and the sink ends
exactly as it was first delivered.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from deltalake import DeltaTable

from devstack.spark import SparkConnectServer
from tests.integration.job_processes import JobProcesses
from falkirk.policies.store.commits import open_table, scan
from falkirk.spark_jobs.travellers import CHUNKS, Layout

pytestmark = pytest.mark.integration
CAPACITY = 8


class Processes(JobProcesses):
    """draw and deliver of one root; a process's log is named after its role and epoch."""

    def __init__(self, root: Path, remote: str) -> None:
        super().__init__("falkirk.spark_jobs.travellers", remote, root / "logs", ["--root", str(root)])

    def start(self, role: str, epoch: int, *args: str, crash: str = "") -> subprocess.Popen:
        return super().start(role, "--epoch", str(epoch), *args, crash=crash, label=str(epoch))

    def logs(self, role: str, epoch: int) -> str:
        return self.text(f"*-{role}-{epoch}")


def delivered(layout: Layout, epoch: int) -> dict[str, tuple[int, int, int]]:
    with sqlite3.connect(layout.database) as db:
        return {k: (v, c, t) for k, v, c, t in db.execute(
            "SELECT key, value, chunk, txn FROM delivered WHERE epoch = ?", (epoch,))}


def transactions(layout: Layout, epoch: int) -> dict[int, tuple[int, float]]:
    with sqlite3.connect(layout.database) as db:
        return {t: (n, at) for t, n, at in db.execute(
            "SELECT txn, rows, committed_at FROM transactions WHERE epoch = ?", (epoch,))}


def determinants(layout: Layout, epoch: int) -> dict[str, tuple[int, int]]:
    rows = scan(open_table(layout.table("determinants")), where={"epoch": epoch}).to_pylist()
    return {r["key"]: (r["value"], r["chunk"]) for r in rows}


def saved_at(layout: Layout, epoch: int) -> dict[int, float]:
    """When each chunk's determinants were committed (the Delta commit's timestamp, seconds)."""
    found = {}
    for h in DeltaTable(layout.table("determinants")).history():
        predicate = str(h.get("operationParameters", {}).get("predicate", ""))
        for chunk in range(1, CHUNKS + 1):
            if f"epoch = {epoch} AND chunk = {chunk}" in predicate:
                found[chunk] = h["timestamp"] / 1000
    return found


def edge_rows_before_the_rewind(layout: Layout, epoch: int) -> list[dict]:
    """The edge's rows of ``epoch`` as the killed attempt left them (time travel before the delete)."""
    table = DeltaTable(layout.table("edge"))
    deletes = [h["version"] for h in table.history() if h.get("operation") == "DELETE"]
    table.load_as_version(min(deletes) - 1)
    return [r for r in table.to_pyarrow_table().to_pylist() if r["epoch"] == epoch]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, spark_connect: SparkConnectServer):
    root = tmp_path_factory.mktemp("travellers")
    layout = Layout(str(root))
    procs = Processes(root, spark_connect.url)
    # epoch 1: marker pairs; draw killed after chunk 3's rows are sent, before they are saved
    sink = procs.start("deliver", 1, "--capacity", str(CAPACITY))
    killed = procs.start("draw", 1, crash="draws:1:chunk-3-after-files").wait(timeout=300)
    deadline = time.monotonic() + 120
    while len(delivered(layout, 1)) < len(determinants(layout, 1)):  # chunks 1-2 are saved: the sink commits them
        assert time.monotonic() < deadline, procs.logs("deliver", 1)
        time.sleep(0.2)
    first_sight = delivered(layout, 1)
    redraw_at = time.time()  # the epoch's remaining rows are drawn from here on
    procs.start("draw", 1).wait(timeout=300)
    drawn_at = time.time()
    assert sink.wait(timeout=300) == 0, procs.logs("deliver", 1)
    first_delivery, first_transactions = delivered(layout, 1), transactions(layout, 1)
    killed_rows = edge_rows_before_the_rewind(layout, 1)
    # epoch 2: slow travellers only, a transaction smaller than a chunk
    slow = procs.start("deliver", 2, "--capacity", str(CAPACITY), "--markers", "slow")
    slow_draw = procs.start("draw", 2, "--markers", "slow").wait(timeout=300)
    slow_code = slow.wait(timeout=300)
    slow_delivered = delivered(layout, 2)
    # epoch 3: the task treated as deterministic; the sink has room for whole chunks
    naive = procs.start("deliver", 3, "--capacity", "64", "--markers", "slow")
    procs.start("draw", 3, "--markers", "slow", "--assume-deterministic", crash="draws:3:chunk-4").wait(timeout=300)
    deadline = time.monotonic() + 120
    while {c for _, c, _ in delivered(layout, 3).values()} != {1, 2, 3}:
        assert time.monotonic() < deadline, procs.logs("deliver", 3)
        time.sleep(0.2)
    naive_first = delivered(layout, 3)
    procs.start("draw", 3, "--markers", "slow", "--assume-deterministic").wait(timeout=300)
    assert naive.wait(timeout=300) == 0, procs.logs("deliver", 3)
    naive_final = delivered(layout, 3)
    # later, downstream is lost: the edge, its control table and the SQL database
    for lost in ("edge", "fast"):
        shutil.rmtree(layout.table(lost))
    os.remove(layout.database)
    sink = procs.start("deliver", 1, "--capacity", str(CAPACITY))
    assert procs.start("draw", 1).wait(timeout=300) == 0
    assert sink.wait(timeout=300) == 0, procs.logs("deliver", 1)
    return SimpleNamespace(layout=layout, procs=procs, killed=killed, first_sight=first_sight, drawn_at=drawn_at,
                           redraw_at=redraw_at,
                           slow_code=slow_code, slow_draw=slow_draw, slow_delivered=slow_delivered, naive_first=naive_first, naive_final=naive_final,
                           first_delivery=first_delivery, first_transactions=first_transactions,
                           killed_rows=killed_rows,
                           redelivered=delivered(layout, 1))


def test_the_sink_holds_every_saved_row_exactly_once_after_the_producer_was_killed(run) -> None:
    assert run.killed == -9
    saved = determinants(run.layout, 1)
    rows = run.first_delivery
    assert {k: (v, c) for k, (v, c, _) in rows.items()} == saved
    assert {c for _, c in saved.values()} == set(range(1, CHUNKS + 1))


def test_what_was_committed_before_the_kill_is_what_the_sink_holds_at_the_end(run) -> None:
    final = run.first_delivery
    assert run.first_sight, "nothing was committed while the first attempt ran"
    assert {k: final[k] for k in run.first_sight} == run.first_sight


def test_every_commit_was_of_rows_whose_determinants_were_already_saved(run) -> None:
    saved = saved_at(run.layout, 1)
    txns = run.first_transactions
    for key, (_, chunk, txn) in run.first_delivery.items():
        assert saved[chunk] <= txns[txn][1], f"{key} (chunk {chunk}) committed in txn {txn} before it was saved"


def test_the_sink_committed_in_bounded_transactions_while_the_producer_ran(run) -> None:
    txns = run.first_transactions
    assert max(n for n, _ in txns.values()) <= CAPACITY - 1  # one slot is kept for a fast traveller
    assert len(txns) >= len(run.first_delivery) // (CAPACITY - 1)
    # before the rest of the epoch was even drawn (not a margin of wall time, which load stretches)
    assert min(at for _, at in txns.values()) < run.redraw_at < run.drawn_at


def test_the_killed_attempts_unsaved_rows_were_forgotten_and_drawn_again(run) -> None:
    unsaved = {r["key"]: r["value"] for r in run.killed_rows if r["kind"] == "data" and r["chunk"] == 3 and r["attempt"] == 1}
    saved = {k: v for k, (v, c) in determinants(run.layout, 1).items() if c == 3}
    assert unsaved and unsaved != saved  # the second draw differs: the task is really non-deterministic
    assert "forgotten" in run.procs.logs("deliver", 1) and "replays chunks 1-2" in run.procs.logs("draw", 1)


def test_slow_travellers_alone_stall_with_a_transaction_smaller_than_a_chunk(run) -> None:
    assert run.slow_draw == 0 and run.slow_code == 3
    log = run.procs.logs("deliver", 2)
    assert f"stalled: the open transaction holds {CAPACITY} of {CAPACITY} rows (chunks [1])" in log, log
    assert run.slow_delivered == {}


def test_treating_the_task_as_deterministic_changes_rows_already_delivered(run) -> None:
    final = run.naive_final
    changed = {k for k in run.naive_first if final.get(k, (None,))[0] != run.naive_first[k][0]}
    assert changed, "a new draw should have replaced committed rows with different ones"


def test_after_downstream_is_lost_the_epoch_is_delivered_again_exactly_as_first_delivered(run) -> None:
    assert {k: (v, c) for k, (v, c, _) in run.redelivered.items()} == {
        k: (v, c) for k, (v, c, _) in run.first_delivery.items()}
    assert "chunks 1-4 sent again from their determinants, as first drawn" in run.procs.logs("draw", 1)
