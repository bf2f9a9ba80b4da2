"""Recovery never loses or doubles data: the faults of the recovery path, each injected for
real on Delta tables on local disk (no Airflow, no Spark: those drills are in
``tests/integration/recovery/test_replay.py``).

* two attempts racing on a table's first commit, and on the ledger: one commit each;
* a stateful task never restores across an epoch a recovery rolled back;
* a partition deleted under a ledger row (garbage collection) is no longer "readable";
* leases expire, are taken over (recorded), released by hand, and exclude collections;
* garbage collection never deletes outside the store, whatever a ledger row says;
* bounded inputs on the command line; lost scratch locations confined to the scratch root;
* a resumed replay never clears again an instance that commits while it reads Airflow's states;
* a replay runs a plan that rebuilds a lost sender-log state while the blocks it needs are kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from falkirk.policies.ids import CommitId, ProcessorId
from falkirk.policies.planning.recovery import FailedTask, RecoveryPlan
from falkirk.policies.regimes import LazyCheckpoint, Tier
from falkirk.policies.store import StoreConfig, StoreError
from falkirk.policies.store.commits import CommitKey, commit_epoch, open_table, scan
from falkirk.policies.store.control import Collections
from falkirk.policies.store.ledger import InputRef, Ledger, LedgerEntry, LedgerSnapshot, OutputRef
from falkirk.policies.store.readability import StoreReadability
from falkirk.policies.planning.recovery_log import LeaseHeld, LeaseLost, NoLease, RecoveryLog, open_lease
from falkirk.spark_jobs.delta_sink import StagedFiles, publish
from tests.sentinel import checksum

BIN = Path(sys.executable).parent


@pytest.fixture
def store(tmp_path: Path) -> StoreConfig:
    return StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))


def _staged(uri: str, key: CommitKey, tag: str, rows: int = 10) -> StagedFiles:
    os.makedirs(f"{uri}/epoch={key.epoch}", exist_ok=True)
    relative = f"epoch={key.epoch}/part-{tag}.parquet"
    pq.write_table(pa.table({"x": pa.array(range(rows), pa.int64())}), f"{uri}/{relative}")
    return StagedFiles(uri, key, pa.schema([("x", pa.int64()), ("epoch", pa.int64())]),
                       ((relative, os.path.getsize(f"{uri}/{relative}"), rows),), None, table=open_table(uri))


def _race(*calls) -> list:
    barrier, results = threading.Barrier(len(calls)), [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_two_attempts_racing_on_a_tables_first_commit_commit_once(tmp_path: Path) -> None:
    """Both attempts find no table; before the fix delta-rs replayed the loser's CREATE as
    version 1 and both files counted (20 rows) in about half the trials."""
    doubled = []
    for trial in range(20):
        uri = str(tmp_path / f"t{trial}")
        key = CommitKey(dag_id="d", task_id="t", epoch=1, map_index=-1, incarnation=0)
        a, b = _staged(uri, key, "a"), _staged(uri, key, "b")
        results = _race(lambda: publish(a), lambda: publish(b))
        rows = scan(open_table(uri)).num_rows
        if rows != 10 or sorted(r.applied for r in results) != [False, True]:
            doubled.append((trial, rows, [r.applied for r in results]))
    assert doubled == []


def test_racing_ledger_appends_record_each_key_once(store: StoreConfig) -> None:
    ledger = Ledger(store)
    entries = [LedgerEntry(dag_id="d", task_id=f"t{i}", epoch=1, regime="ephemeral", run_id="epoch-1", try_number=1) for i in range(5)]
    same = LedgerEntry(dag_id="d", task_id="twice", epoch=1, regime="ephemeral", run_id="epoch-1", try_number=1)
    results = _race(*[lambda e=e: ledger.append(e) for e in entries], lambda: ledger.append(same),
                    lambda: ledger.append(same))
    assert results[:5] == [True] * 5 and sorted(results[5:]) == [False, True]
    raw = scan(open_table(store.ledger_uri)).column("task_id").to_pylist()  # every physical row
    assert sorted(raw) == sorted([f"t{i}" for i in range(5)] + ["twice"])


def _lazy_rows(store: StoreConfig, epochs: range) -> list[LedgerEntry]:
    """model (LazyCheckpoint every=3) committed ``epochs``, each with its state table's epoch."""
    uri = store.table_uri(LazyCheckpoint(every=3).state_tier(1), "d", "model", "state")
    rows = []
    for e in epochs:
        key = CommitKey(dag_id="d", task_id="model", epoch=e)
        commit_epoch(uri, pa.table({"epoch": [e, e], "total": [e, 2 * e]}), key)
        rows.append(LedgerEntry(dag_id="d", task_id="model", epoch=e, regime="lazy_checkpoint(every=3)", run_id=f"epoch-{e}", try_number=1, state_uri=uri,
                                state_tier="scratch", state_rows=2, notified_through=e))
    return rows


def test_a_stateful_task_never_restores_across_a_rolled_back_epoch(store: StoreConfig) -> None:
    """Epochs 4-6 are rolled back by a recovery and not redone yet; a new DAG run's epoch 7
    used to restore epoch 3's state (the latest current row) and commit wrong totals."""
    from falkirk.policies.job_spec import JobSpec
    from falkirk.spark_jobs.runtime import EpochContext, RolledBack

    ledger = Ledger(store)
    rows = _lazy_rows(store, range(1, 7))
    for r in rows:
        ledger.append(r)
    ledger.invalidations.record(rows[3:], "plan-x")
    spec = lambda epoch: JobSpec(dag_id="d", task_id="model", epoch=epoch, regime=LazyCheckpoint(every=3),  # noqa: E731
                                 run_id=f"epoch-{epoch}", try_number=1)
    with pytest.raises(RolledBack, match=r"model epoch 7: the previous epoch 6 was rolled back by a recovery"):
        EpochContext(spec(7), store, ledger, spark=None).previous_checkpoint()
    # The redo of epoch 4 restores epoch 3, as the plan says; a first epoch restores nothing.
    assert EpochContext(spec(4), store, ledger, spark=None).previous_checkpoint().epoch == 3
    assert EpochContext(spec(1), store, ledger, spark=None).previous_checkpoint() is None


def test_a_commit_that_read_a_producer_epoch_rolled_back_meanwhile_in_another_dag_is_refused(store: StoreConfig) -> None:
    """leaders (a DAG on publish's Asset) read publish epoch 3; before its commit, a recovery in
    publish's DAG rolls that epoch back: the commit is not made, or withdrawn if it was."""
    from falkirk.policies.job_spec import JobSpec
    from falkirk.policies.regimes import EagerCheckpoint
    from falkirk.policies.store.ledger import AssetInput
    from falkirk.spark_jobs.assets import producer_rows
    from falkirk.spark_jobs.runtime import EpochContext, RolledBack, _check_still_current

    ledger = Ledger(store)
    publish = [LedgerEntry(dag_id="orders", task_id="publish", epoch=e, regime="batch(log_outputs=true)", run_id=f"epoch-{e}", try_number=1) for e in (1, 2, 3)]
    for r in publish:
        ledger.append(r)
    spec = JobSpec(dag_id="leaders", task_id="leaders", epoch=3, regime=EagerCheckpoint(), run_id="asset_triggered__3",
                   try_number=1)
    ctx = EpochContext(spec, store, ledger, spark=None)
    assert producer_rows(ctx, "orders").find("publish", 3).incarnation == 0  # what read_asset reads
    ctx.asset_inputs.append(AssetInput(asset="orders.ranking", dag_id="orders", task_id="publish", output="output", epoch=3, incarnation=0))
    entry = LedgerEntry(dag_id="leaders", task_id="leaders", epoch=3, regime="eager_checkpoint", run_id="asset_triggered__3", try_number=1,
                        asset_inputs=tuple(ctx.asset_inputs))
    assert _check_still_current(ctx, entry, appended=False) == ctx.rows.rollbacks_version  # nothing rolled back
    ledger.invalidations.record([publish[2]], "plan-in-orders")
    with pytest.raises(RolledBack, match=r"leaders epoch 3: orders.publish epoch 3, read through an Asset, was "
                                         r"rolled back by a recovery in its DAG while this epoch ran; its commit is "
                                         r"not made. Recover this DAG from this epoch once the redo is committed"):
        _check_still_current(ctx, entry, appended=False)
    ledger.append(entry)  # the race the second check is for: appended just before the rollback was seen
    with pytest.raises(RolledBack, match="its commit is withdrawn"):
        _check_still_current(ctx, entry, appended=True)
    assert Ledger(store).find("leaders", "leaders", 3) is None


def test_a_partition_deleted_under_its_ledger_row_is_not_readable(store: StoreConfig) -> None:
    rows = _lazy_rows(store, range(1, 4))
    readable = StoreReadability(store, rows)
    assert all(readable(r.state_uri, r.key) for r in rows)
    open_table(rows[0].state_uri).delete("epoch = 1")  # what a collection does to the table
    readable = StoreReadability(store, rows)
    assert [readable(r.state_uri, r.key) for r in rows] == [False, True, True]


def _plan(dag: str = "d", epoch: int = 2) -> RecoveryPlan:
    return RecoveryPlan(dag, (FailedTask("a", epoch),), epoch, 7, ())


def test_a_lease_not_renewed_expires_and_the_takeover_is_recorded(store: StoreConfig, monkeypatch) -> None:
    monkeypatch.setenv("FALKIRK_LEASE_SECONDS", "5")
    log, plan = RecoveryLog(store), _plan()
    log.record(plan)
    first = log.begin(plan, holder="alice")
    first = log.renew(first)
    with pytest.raises(LeaseHeld, match="falkirk release --dag d"):
        log.begin(plan, holder="bob")
    with pytest.raises(LeaseHeld, match="recovered by plan"):
        log.begin_collection("d", holder="gc")
    time.sleep(5.5)  # alice died: no renewal
    second = log.begin(plan, holder="bob")
    assert second.resumed
    with pytest.raises(LeaseLost, match=f"Resume with: falkirk replay {plan.plan_id}"):
        log.renew(first)  # alice comes back: she must stop
    assert log.end(first, "failed") is False  # and cannot end bob's lease
    assert log.end(second, "finished")
    events = [(r["event"], r["holder"]) for r in log.events("d") if r["event"] != "heartbeat"]
    assert events == [("planned", "falkirk plan"), ("started", "alice"), ("expired", "bob"), ("resumed", "bob"),
                      ("finished", "bob")]


def test_a_lease_released_by_hand_is_audited_and_its_holder_stops(store: StoreConfig) -> None:
    log, plan = RecoveryLog(store), _plan()
    log.record(plan)
    with pytest.raises(NoLease, match="no recovery or collection of DAG 'd' holds a lease"):
        log.release("d", "admin", "nothing to release")
    lease = log.begin(plan, holder="alice")
    with pytest.raises(ValueError, match="--reason"):
        log.release("d", "admin", "  ")
    released = log.release("d", "admin", "the replay's host was lost")
    assert released.plan_id == plan.plan_id and open_lease(log.events("d"), "d") is None
    row = [r for r in log.events("d") if r["event"] == "released"][0]
    assert row["holder"] == "admin" and "the replay's host was lost" in row["detail"]
    with pytest.raises(LeaseLost):
        log.renew(lease)
    assert log.begin(plan, holder="bob").resumed


def test_collection_and_recovery_exclude_each_other(store: StoreConfig) -> None:
    from falkirk.policies.planning.collector import collect

    ledger = Ledger(store)
    for r in _lazy_rows(store, range(1, 4)):
        ledger.append(r)
    log, plan = RecoveryLog(store), _plan()
    lease = log.begin(plan, holder="alice")
    with pytest.raises(LeaseHeld, match=f"is being recovered by plan {plan.plan_id}"):
        collect(store, "d", retain_hours=0)
    assert Collections(ledger.store).through("d") == {}
    log.end(lease, "finished")
    gc = log.begin_collection("d", holder="gc")
    with pytest.raises(LeaseHeld, match="is being collected"):
        log.begin(_plan(epoch=3), holder="bob")
    log.end(gc, "finished")


def test_collection_never_deletes_outside_the_store_whatever_a_ledger_row_says(store: StoreConfig,
                                                                               tmp_path: Path) -> None:
    from falkirk.policies.planning.collector import collect

    sentinel = tmp_path / "sentinel" / "table"  # a Delta table outside the store, epochs 1-3
    for e in (1, 2, 3):
        commit_epoch(str(sentinel), pa.table({"epoch": [e], "x": [e]}), CommitKey(dag_id="d", task_id="src", epoch=e))
    before = checksum(tmp_path / "sentinel")
    ledger = Ledger(store)
    own = store.table_uri(LazyCheckpoint(every=1).state_tier(1), "d", "src", "output")
    for e in (1, 2, 3):  # src's output rows point at the sentinel; dst reads them
        ledger.append(LedgerEntry(dag_id="d", task_id="src", epoch=e, regime="batch(log_outputs=true)", run_id=f"epoch-{e}", try_number=1, notified_through=e,
                                  outputs=(OutputRef("output", str(sentinel), "durable", e, 1),)))
        from falkirk.policies.store.ledger import InputRef
        ledger.append(LedgerEntry(dag_id="d", task_id="dst", epoch=e, regime="batch(log_outputs=true)", run_id=f"epoch-{e}", try_number=1, notified_through=e,
                                  outputs=(OutputRef("output", own, "durable", e, 0),),
                                  inputs=(InputRef(task_id="src", output="output", through=e),)))
    with pytest.raises(ValueError, match=rf"task 'src' names its output table '{sentinel}', which is not where "
                                         rf"the store keeps it.*refusing to delete anything"):
        collect(store, "d", retain_hours=0)
    assert checksum(tmp_path / "sentinel") == before and Collections(ledger.store).through("d") == {}
    assert not StoreReadability(store)(str(sentinel), CommitKey(dag_id="d", task_id="src", epoch=1))  # never read either


def test_collection_reclaims_the_scratch_a_worker_wrote_on_its_own_disk(store: StoreConfig) -> None:
    """A ledger row written on a worker names its disk (``<scratch>/worker-a/...``); ``falkirk gc``,
    run where no worker is named, collects it like any scratch table of the task, and still
    refuses a path that only looks like a worker's."""
    from falkirk.policies.planning.collector import collect

    on_worker = StoreConfig(store.durable_uri, store.scratch_uri, worker="worker-a")
    ledger = Ledger(store)
    regime = LazyCheckpoint(every=3)
    for e in range(1, 8):
        tier = regime.state_tier(e)
        uri = on_worker.table_uri(tier, "d", "model", "state")
        commit_epoch(uri, pa.table({"epoch": [e], "total": [e]}), CommitKey(dag_id="d", task_id="model", epoch=e))
        ledger.append(LedgerEntry(dag_id="d", task_id="model", epoch=e, regime="lazy_checkpoint(every=3)", run_id=f"epoch-{e}", try_number=1, state_uri=uri,
                                  state_tier=tier.value, state_rows=1, notified_through=e))
    scratch = on_worker.table_uri(regime.state_tier(1), "d", "model", "state")
    assert scratch.startswith(f"{store.scratch_uri}/worker-a/")
    report = collect(store, "d", retain_hours=0)
    reclaimed = {r.uri: r.epochs for r in report.plan.tables}
    assert reclaimed.get(scratch) == (1, 2, 4, 5), reclaimed
    assert sorted(r["epoch"] for r in scan(open_table(scratch)).to_pylist()) == [7]
    assert not store.is_table_of(f"{store.scratch_uri}/../d/model/state", "d", "model", "state")


def test_collection_empties_a_channel_left_on_the_disk_of_a_worker_the_reader_did_not_run_on(
        store: StoreConfig) -> None:
    """``draw`` streams each epoch to ``deliver`` over an edge on its own worker's disk, and
    ``deliver`` clears the edge on *its* disk once it delivered. When a recovery placed
    ``deliver@3`` on worker-a while ``draw@3`` had run on worker-b, epoch 3 stayed on worker-b's
    edge; ``draw``'s ledger row names the edge, so ``falkirk gc`` deletes the epochs ``deliver``
    committed there, and keeps epoch 4, which ``draw`` is still streaming."""
    from falkirk.policies.planning.collector import collect
    from falkirk.spark_jobs.marker_edge import MarkerEdge, clear
    from falkirk.spark_jobs.sampled import edge_tables

    ledger = Ledger(store)
    on = {w: StoreConfig(store.durable_uri, store.scratch_uri, worker=w) for w in ("worker-a", "worker-b")}
    drew = {1: "worker-a", 2: "worker-a", 3: "worker-b", 4: "worker-b"}
    for e, worker in drew.items():
        tables = edge_tables(on[worker], "d")
        edge = MarkerEdge(tables, e, chunks=1)
        edge.start([])
        edge.send(1, [{"key": f"{e}-{k}", "value": k} for k in range(3)])
        edge.saved(1)
        if e == 4:  # still drawing: no ledger row yet
            continue
        log = store.table_uri(Tier.DURABLE, "d", "draw", "output")
        commit_epoch(log, pa.table({"epoch": [e], "key": [f"{e}-0"]}), CommitKey(dag_id="d", task_id="draw", epoch=e))
        ledger.append(LedgerEntry(dag_id="d", task_id="draw", epoch=e, regime="batch(log_outputs=true)", run_id=f"epoch-{e}", try_number=1, notified_through=e,
                                  outputs=(OutputRef("output", log, "durable", e, 1),), worker=worker,
                                  channels=(tables.edge, tables.control)))
        ledger.append(LedgerEntry(dag_id="d", task_id="deliver", epoch=e, regime="batch", run_id=f"epoch-{e}", try_number=1, notified_through=e, worker="worker-a",
                                  inputs=(InputRef(task_id="draw", output="output", through=e),)))
        clear(edge_tables(on["worker-a"], "d"), e)  # deliver, on worker-a, clears its own disk's edge
    left = edge_tables(on["worker-b"], "d")

    def epochs(uri: str) -> list[int]:
        return sorted({r["epoch"] for r in scan(open_table(uri)).to_pylist()})

    assert epochs(left.edge) == [3, 4] and epochs(left.control) == [3, 4]
    assert ledger.entries("d", "draw")[-1].channels == (left.edge, left.control)  # read back from the ledger
    report = collect(store, "d", retain_hours=0)
    reclaimed = {r.uri: (r.kind, r.epochs) for r in report.plan.tables if r.task_id == "draw"}
    assert reclaimed == {left.edge: ("channel", (3,)), left.control: ("channel", (3,)),
                         store.table_uri(Tier.DURABLE, "d", "draw", "output"): ("log", (1, 2, 3))}, reclaimed
    assert epochs(left.edge) == [4] and epochs(left.control) == [4]
    assert collect(store, "d", retain_hours=0).plan.tables == ()  # nothing left to reclaim


def test_a_job_naming_a_channel_that_is_not_its_own_scratch_table_is_refused(store: StoreConfig) -> None:
    from types import SimpleNamespace

    from falkirk.spark_jobs.runtime import JobError, _own_channels

    ctx = SimpleNamespace(args=SimpleNamespace(dag_id="d", task_id="draw", map_index=-1, processor="draw", epoch=3),
                          store=StoreConfig(store.durable_uri, store.scratch_uri, worker="worker-a"))
    own = ctx.store.table_uri(Tier.SCRATCH, "d", "draw", "edge")
    assert _own_channels(ctx, (own,)) == (own,)
    with pytest.raises(JobError, match=r"draw epoch 3: EpochResult.channels names '.*/worker-b/d/draw/edge', which is "
                                       r"not a scratch table of this task on this worker"):
        _own_channels(ctx, (own.replace("/worker-a/", "/worker-b/"),))


def test_the_gc_watermark_drill_deletes_the_checkpoint_recovery_restores_from(store: StoreConfig, monkeypatch) -> None:
    """``FALKIRK_BROKEN=gc-watermark`` (a soak's drill) also deletes the oldest checkpoint kept."""
    from falkirk.policies.planning.collector import collect
    from falkirk.policies.regimes import Tier

    ledger = Ledger(store)
    for e in range(1, 8):
        uri = store.table_uri(Tier.DURABLE, "d", "model", "state")
        commit_epoch(uri, pa.table({"epoch": [e], "total": [e]}), CommitKey(dag_id="d", task_id="model", epoch=e))
        ledger.append(LedgerEntry(dag_id="d", task_id="model", epoch=e, regime="eager_checkpoint", run_id=f"epoch-{e}", try_number=1, state_uri=uri,
                                  state_tier="durable", state_rows=1, notified_through=e))
    monkeypatch.setenv("FALKIRK_BROKEN", "gc-watermark")
    report = collect(store, "d", retain_hours=0)
    assert [r.epochs for r in report.plan.tables] == [(1, 2, 3, 4, 5, 6)]
    assert open_table(uri) is not None and scan(open_table(uri)).to_pylist() == []  # 7 went too


def _falkirk(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "falkirk"), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, message", [
    (["plan", "--dag", "d", "--bad-epoch", "a:1", "--last-epoch", "100000000000000000000"],
     "argument --last-epoch: '100000000000000000000': give an epoch from 1 to 1000000000"),
    (["plan", "--dag", "d", "--bad-epoch", "a:99999999999999999999"],
     "--bad-epoch 'a:99999999999999999999': write it as TASK:EPOCH with an epoch from 1 to 1000000000"),
    (["gc", "--dag", "d", "--retain-hours", "100000000000000000000"],
     "--retain-hours 100000000000000000000: give a whole number of hours from 0 to 87600"),
    (["solve", "/dev/zero"], "/dev/zero: larger than 16 MiB"),
    (["plan", "--dag", "d", "--lost-scratch", "/"], "--lost-scratch '/' is not the scratch root"),
    (["plan", "--dag", "d", "--lost-scratch", "SCRATCH/../durable"], "is not the scratch root"),
    (["release", "--dag", "d", "--reason", "x"], "no recovery or collection of DAG 'd' holds a lease"),
    (["plan", "--dag", "d", "--lost-scratch", "SCRATCH/d/other"], "--lost-scratch SCRATCH/d/other: the ledger "
     "records nothing of DAG 'd' kept there, so losing it changes nothing; name a directory that held its scratch "
     "data: SCRATCH/d/model"),
])
def test_bad_command_lines_are_refused_quickly_naming_the_field_and_change_nothing(
        store: StoreConfig, tmp_path: Path, args: list[str], message: str) -> None:
    ledger = Ledger(store)
    for r in _lazy_rows(store, range(1, 4)):
        ledger.append(r)
    before = checksum(tmp_path)
    args = [a.replace("SCRATCH", store.scratch_uri) for a in args]
    started = time.monotonic()
    proc = _falkirk(*args, env=store.env())
    assert proc.returncode == 2 and message.replace("SCRATCH", store.scratch_uri) in proc.stderr, proc.stderr
    assert time.monotonic() - started < 30  # refused, not computed
    assert checksum(tmp_path) == before


def test_an_unreachable_airflow_is_named_with_the_url_and_the_variable(store: StoreConfig) -> None:
    """Nothing listens on port 9 here: the connection is refused, and the message says where
    the URL came from instead of a traceback."""
    env = {**store.env(), "FALKIRK_AIRFLOW_URL": "http://127.0.0.1:9", "FALKIRK_AIRFLOW_USER": "admin",
           "FALKIRK_AIRFLOW_PASSWORD": "admin"}
    for args in (["plan", "--dag", "d", "--failed-task", "model"], ["replay", "0123456789ab"]):
        proc = _falkirk(*args, env=env)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith(f"falkirk {args[0]}: cannot reach Airflow at http://127.0.0.1:9 (ConnectError: "), \
            proc.stderr
        assert proc.stderr.rstrip().endswith("check --airflow-url (or FALKIRK_AIRFLOW_URL) and that Airflow's API "
                                             "server is running"), proc.stderr


@pytest.mark.parametrize("command, variables", [
    ("plan", ("FALKIRK_STORE_URI", "FALKIRK_STORE_CONN_ID", "FALKIRK_AIRFLOW_URL", "FALKIRK_AIRFLOW_TOKEN",
              "falkirk plan --dag falkirk_clicks --bad-epoch source:4 --json")),
    ("replay", ("FALKIRK_STORE_URI", "FALKIRK_AIRFLOW_USER, FALKIRK_AIRFLOW_PASSWORD", "falkirk replay 3f9c0a1b2c4d")),
    ("gc", ("FALKIRK_SCRATCH_URI", "AWS_ENDPOINT_URL", "falkirk gc --dag falkirk_clicks --dry-run")),
])
def test_each_commands_help_lists_the_variables_it_needs_with_an_example(command: str, variables: tuple) -> None:
    proc = _falkirk(command, "--help")
    assert proc.returncode == 0 and all(v in proc.stdout for v in variables), proc.stdout


def test_scratch_locations_are_confined_to_the_scratch_root(store: StoreConfig) -> None:
    inside = store.scratch_location(store.scratch_uri + "/d/model/")
    assert inside == store.scratch_uri + "/d/model"
    for bad in ("/", store.durable_uri, store.scratch_uri + "/../durable", "s3://bucket/x", "", "é" * 5000):
        with pytest.raises(StoreError):
            store.scratch_location(bad)


@pytest.mark.parametrize("damage", ["a missing _delta_log entry", "a truncated data file"])
def test_a_damaged_ledger_is_named_with_the_way_out_and_nothing_changes(store: StoreConfig, tmp_path: Path,
                                                                         damage: str) -> None:
    ledger = Ledger(store)
    for r in _lazy_rows(store, range(1, 5)):
        ledger.append(r)
    if damage == "a missing _delta_log entry":
        (Path(store.ledger_uri) / "_delta_log" / "00000000000000000002.json").unlink()
    else:
        data = sorted(Path(store.ledger_uri).glob("*.parquet"))[0]
        data.write_bytes(data.read_bytes()[:40])
    before = checksum(tmp_path)
    for args in (["plan", "--dag", "d", "--bad-epoch", "model:2"], ["gc", "--dag", "d", "--retain-hours", "0"]):
        proc = _falkirk(*args, env=store.env())
        assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
        assert f"the Delta table file://{store.ledger_uri}" in proc.stderr or store.ledger_uri in proc.stderr
        assert "restore the table from a backup. Nothing was changed" in proc.stderr
    assert checksum(tmp_path) == before


def test_a_ledger_row_pointing_at_a_collected_table_is_not_counted(store: StoreConfig) -> None:
    """model's state table is gone (collected, or its scratch lost) while the ledger still
    lists epochs 1-4: the plan restores nothing from it and re-runs model from empty state,
    and a reader fails naming the table and epoch."""
    from falkirk.plugins.recovery import compute_plan
    from falkirk.policies.planning.recovery import BadEpoch
    from falkirk.policies.regimes import Regime

    ledger = Ledger(store)
    rows = _lazy_rows(store, range(1, 5))
    for r in rows:
        ledger.append(r)
    import shutil

    shutil.rmtree(rows[0].state_uri)
    plan = compute_plan("d", store, [BadEpoch("model", 2)], {"model": Regime.parse("lazy_checkpoint(every=3)")},
                        record=False)
    assert plan.task("model").restore_from is None and plan.task("model").rerun == (1, 2, 3, 4)
    assert not StoreReadability(store, rows)(rows[0].state_uri, CommitKey(dag_id="d", task_id="model", epoch=1))


def _windowed_rows(store: StoreConfig) -> list[LedgerEntry]:
    """DAG w, epochs 1-4: events (ephemeral, its output in scratch), rank (eager checkpoints of a
    state that consumed events through each epoch) and popularity (batch, reading a window of
    events' epochs e-1 and e). popularity's epoch 4 failed: it has no row."""
    from falkirk.policies.regimes import Tier
    from falkirk.policies.store.ledger import InputRef

    events_uri = store.table_uri(Tier.SCRATCH, "w", "events", "output")
    state_uri = store.table_uri(Tier.DURABLE, "w", "rank", "state")
    pop_uri = store.table_uri(Tier.DURABLE, "w", "popularity", "output")
    rows = []
    for e in range(1, 5):
        for uri, task in ((events_uri, "events"), (state_uri, "rank"), (pop_uri, "popularity")):
            commit_epoch(uri, pa.table({"epoch": [e], "x": [e]}), CommitKey(dag_id="w", task_id=task, epoch=e))
        out = lambda name, uri, tier: (OutputRef(name, uri, tier, e - 1, 1),)  # noqa: E731
        rows.append(LedgerEntry(dag_id="w", task_id="events", epoch=e, regime="ephemeral", run_id=f"epoch-{e}", try_number=1, notified_through=e,
                                outputs=out("output", events_uri, "scratch")))
        rows.append(LedgerEntry(dag_id="w", task_id="rank", epoch=e, regime="eager_checkpoint", run_id=f"epoch-{e}", try_number=1, state_uri=state_uri,
                                state_tier="durable", state_version=e - 1, state_rows=1, notified_through=e,
                                inputs=(InputRef(task_id="events", output="output", through=e),)))
        if e < 4:
            rows.append(LedgerEntry(dag_id="w", task_id="popularity", epoch=e, regime="batch(log_outputs=true)", run_id=f"epoch-{e}", try_number=1,
                                    notified_through=e, outputs=out("output", pop_uri, "durable"),
                                    inputs=(InputRef(task_id="events", output="output", through=e, reads_back=1),)))
    return rows


def _replay_started(store: StoreConfig, plan: RecoveryPlan) -> None:
    """What a replay does before its first re-run: record the plan, take the lease, roll back the
    rows it re-runs (the re-runs have not committed yet)."""
    ledger, log = Ledger(store), RecoveryLog(store)
    log.record(plan)
    log.begin(plan, "test")
    ledger.invalidations.record([e for e in ledger.entries(plan.dag_id) if (e.processor, e.epoch) in plan.rerun_set()],
                                plan.plan_id)
    log.release(plan.dag_id, "test", "the replay stops here")


def test_a_plan_made_while_a_replay_rewrites_a_kept_epoch_keeps_it_too(store: StoreConfig) -> None:
    """The scratch holding events' output is lost and popularity failed at epoch 4. The plan
    keeps every checkpoint through epoch 3 (rank's state consumed events through it) and re-runs
    epoch 4, and events 3 only to write its output again for popularity's window. Its replay
    rolls back the rows it re-runs (a re-run needs a new incarnation) and stops before they
    commit. A plan made then, for the same failures, must keep what the first kept: taking
    events 3 for undone, it rolled rank back below its checkpoint of epoch 3, to epoch 2 (a
    source may have forgotten input that only such a plan asks for again)."""
    from falkirk.plugins.recovery import compute_plan
    from falkirk.policies.planning.recovery import BadEpoch, LostScratch
    from falkirk.policies.regimes import Regime

    ledger = Ledger(store)
    for r in _windowed_rows(store):
        ledger.append(r)
    regimes = {"events": Regime.parse("ephemeral"), "rank": Regime.parse("eager_checkpoint"),
               "popularity": Regime.parse("batch(log_outputs=true)")}
    failures = [FailedTask("popularity", 4), LostScratch(f"{store.scratch_uri}/w")]
    first = compute_plan("w", store, failures, regimes, record=False)
    assert {t.task_id: (t.kept_through, t.rerun) for t in first.tasks} == {
        "events": (3, (3, 4)), "rank": (3, (4,)), "popularity": (3, (4,))}
    _replay_started(store, first)

    again = compute_plan("w", store, failures, regimes, record=False)
    assert {t.task_id: (t.kept_through, t.rerun) for t in again.tasks} == {
        t.task_id: (t.kept_through, t.rerun) for t in first.tasks}

    # An epoch a started plan rolls back for real (a bad epoch) is not kept by the next plan.
    bad = compute_plan("w", store, [BadEpoch("events", 3), *failures], regimes, record=False)
    assert bad.task("rank").kept_through == 2 and bad.task("events").rerun == (2, 3, 4)
    _replay_started(store, bad)
    after = compute_plan("w", store, failures, regimes, record=False)
    assert after.task("events").kept_through == 2 and after.task("rank").kept_through == 2


def _sweep(plan: RecoveryPlan, store: StoreConfig) -> int:
    """One first pass's sweep of later DAG runs, as a replay makes it: the observer reads the store
    (no Airflow run is watched), the rule decides, the rollback is appended; returns how many rows
    it rolled back."""
    from falkirk.plugins.replay.observe import Observer
    from falkirk.policies.replay import AirflowView, Memory
    from falkirk.policies.replay.rules import Pass, sweep_later_rows

    observer = Observer(plan, store, None, LedgerSnapshot(Ledger(store), plan.dag_id))
    memory = Memory.fresh(plan.rerun_set(), {}, 0.0, plan.last_epoch)
    nothing = AirflowView(runs={})
    outcome = sweep_later_rows(Pass(plan, observer.stored(memory, nothing), nothing, 0.0), memory)
    return sum(Ledger(store).invalidations.record(a.rows, a.name) for a in outcome.actions)


def test_a_later_run_is_swept_only_if_computed_before_the_rollback(store: StoreConfig) -> None:
    """A DAG run arriving during a recovery: its row computed before the plan's invalidation
    (from the rolled-back epoch) is swept; once redone after it, it is current and stays (the
    sweep runs after every wave of re-runs, so sweeping it again would never end)."""
    from dataclasses import replace

    from falkirk.policies.planning.recovery import TaskPlan

    ledger = Ledger(store)
    rows = _lazy_rows(store, range(1, 7))
    for r in rows[:5]:
        ledger.append(r)
    _, seen = ledger.invalidations.keys_and_version("d")
    early = replace(rows[5], rollbacks_seen=seen)  # epoch 6, computed from epoch 5 before the rollback
    ledger.append(early)
    plan = RecoveryPlan("d", (FailedTask("model", 5),), 5, ledger.version(), (
        TaskPlan("model", "lazy_checkpoint(every=3)", 3, 3, (4, 5), None, (), (4, 5)),))
    assert _sweep(plan, store) == 0  # nothing rolled back yet
    ledger.invalidations.record([r for r in rows if r.epoch in (4, 5)], plan.plan_id)
    assert _sweep(plan, store) == 1
    assert CommitId(dag="d", processor=ProcessorId(task="model"), epoch=6) in ledger.invalidations.keys("d")
    _, seen = ledger.invalidations.keys_and_version("d")
    ledger.append(replace(early, incarnation=1, rollbacks_seen=seen))
    assert _sweep(plan, store) == 0
    assert [(e.epoch, e.incarnation) for e in ledger.entries("d") if e.epoch == 6] == [(6, 1)]


def test_the_sweep_orders_rows_by_the_rollbacks_their_jobs_checked_not_by_clocks(store: StoreConfig) -> None:
    """A worker whose clock runs 15 s ahead stamps its row of epoch 6 (computed from epoch 5
    before the rollback) after the plan's invalidation: the sweep still takes it, since its job
    checked the rollbacks before the plan's. The redo, stamped by a clock 15 s behind, checked
    after it and stays."""
    from dataclasses import replace
    from datetime import datetime, timedelta, timezone

    from falkirk.policies.planning.recovery import TaskPlan

    ledger = Ledger(store)
    rows = _lazy_rows(store, range(1, 7))
    for r in rows[:5]:
        ledger.append(r)
    _, seen = ledger.invalidations.keys_and_version("d")  # epoch 6's job checks the rollbacks ...
    ahead = datetime.now(timezone.utc) + timedelta(seconds=15)
    early = replace(rows[5], committed_at=ahead, rollbacks_seen=seen)
    ledger.append(early)  # ... and appends its row, stamped 15 s ahead
    plan = RecoveryPlan("d", (FailedTask("model", 5),), 5, ledger.dag_version("d"), (
        TaskPlan("model", "lazy_checkpoint(every=3)", 3, 3, (4, 5), None, (), (4, 5)),))
    ledger.invalidations.record([r for r in rows if r.epoch in (4, 5)], plan.plan_id)
    assert ledger.invalidations.version_of("d", plan.plan_id) == seen + 1
    assert _sweep(plan, store) == 1  # the timestamp would have kept it
    assert CommitId(dag="d", processor=ProcessorId(task="model"), epoch=6) in ledger.invalidations.keys("d")
    _, seen = ledger.invalidations.keys_and_version("d")
    behind = datetime.now(timezone.utc) - timedelta(seconds=15)
    ledger.append(replace(early, incarnation=1, committed_at=behind, rollbacks_seen=seen))
    assert _sweep(plan, store) == 0  # redone after the rollback: current
    assert [(e.epoch, e.incarnation) for e in ledger.entries("d") if e.epoch == 6] == [(6, 1)]


class AirflowStatesDouble:
    """In-memory stand-in for Airflow's REST API as the replay's observer reads it (a real
    scheduler cannot be paused between two reads). Reading a run's task instances is the moment
    ``finishing`` commits its epoch to the ledger and Airflow marks it success."""

    def __init__(self, ledger: Ledger, states: dict[str, str], finishing: LedgerEntry) -> None:
        self.ledger, self.states, self.finishing = ledger, states, finishing

    def on_poll(self) -> None:
        pass

    def runs_with_instances(self, dag_id: str, run_ids) -> dict:
        return {r: (self.find_run(dag_id, r), self.task_instances(dag_id, r)) for r in run_ids}

    def find_run(self, dag_id: str, run_id: str) -> dict[str, str]:
        return {"state": "running"}

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, str]]:
        if self.states[self.finishing.task_id] != "success":
            self.ledger.append(self.finishing)
            self.states[self.finishing.task_id] = "success"
        return {t: {"state": s, "queue": "default"} for t, s in self.states.items()}

    def dag(self, dag_id: str) -> dict:
        return {"is_paused": False, "max_active_runs": 16}

    def active_runs(self, dag_id: str) -> list:
        return []


def test_a_resumed_replay_never_clears_an_instance_that_commits_while_it_looks(store: StoreConfig) -> None:
    """model's re-run of epoch 2 commits and succeeds between the resumed replay's reads. Read
    ledger-first, it looked settled without a row and was cleared again, and that re-run was
    refused as a re-run of a completed epoch; read Airflow-first, its row is seen. The failed
    sink (no row) is cleared, the running stats (no row yet) is left to finish."""
    from types import SimpleNamespace

    from falkirk.plugins.replay.observe import Observer
    from falkirk.policies.replay import Clear, Memory, decide

    ledger = Ledger(store)
    model_2 = _lazy_rows(store, range(2, 3))[0]
    rerun = frozenset({("model", 2), ("sink", 2), ("stats", 2)})
    plan = SimpleNamespace(dag_id="d", plan_id="p", failures=(), tasks=(), last_epoch=2, rerun_set=lambda: rerun)
    airflow = AirflowStatesDouble(ledger, {"model": "running", "sink": "failed", "stats": "running"}, model_2)
    memory = Memory.fresh(rerun, {2: "epoch-2"}, 0.0, 2)
    seen = Observer(plan, store, airflow, LedgerSnapshot(ledger, "d")).observe(memory)
    decision = decide(plan, *seen, memory, now=0.0)
    assert [(a.epoch, a.tasks) for a in decision.actions if isinstance(a, Clear)] == [(2, ("sink",))]
    assert [(e.task_id, e.epoch) for e in ledger.entries("d")] == [("model", 2)]


def test_leases_on_two_dags_taken_at_the_same_moment_both_hold_and_one_dag_gets_one(
        store: StoreConfig, monkeypatch) -> None:
    """The recovery log is one table for every DAG. Two collections read it, then append their
    lease rows at the same moment (both held at a barrier between the read and the append): on
    two DAGs both leases hold, the loser of the append reading again and retrying; on one DAG
    exactly one holds and the other is refused, naming the holder."""
    import threading

    from falkirk.policies.planning import recovery_log

    log = RecoveryLog(store)
    log.end(log.begin_collection("first", holder="setup"), "finished")  # the table exists
    real_write = RecoveryLog._write

    def run_together(dags: list[str]) -> dict[str, object]:
        barrier = threading.Barrier(len(dags), timeout=60)
        waited: set[int] = set()

        def write_after_both_read(self, rows, *, table, retries):
            if threading.get_ident() not in waited:  # each thread's first append only
                waited.add(threading.get_ident())
                barrier.wait()
            return real_write(self, rows, table=table, retries=retries)

        monkeypatch.setattr(RecoveryLog, "_write", write_after_both_read)
        results: dict[str, object] = {}

        def take(i: int, dag: str) -> None:
            try:
                results[f"{dag}#{i}"] = RecoveryLog(store).begin_collection(dag, holder=f"gc{i}")
            except BaseException as exc:  # reported below
                results[f"{dag}#{i}"] = exc

        threads = [threading.Thread(target=take, args=(i, d)) for i, d in enumerate(dags)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        monkeypatch.setattr(RecoveryLog, "_write", real_write)
        return results

    two = run_together(["a", "b"])
    assert all(isinstance(r, recovery_log.Lease) for r in two.values()), two
    assert {d: open_lease(log.events(d), d).holder for d in ("a", "b")} == {"a": "gc0", "b": "gc1"}
    one = run_together(["c", "c"])
    held = [r for r in one.values() if isinstance(r, recovery_log.Lease)]
    refused = [r for r in one.values() if not isinstance(r, recovery_log.Lease)]
    assert len(held) == 1 and len(refused) == 1, one
    assert isinstance(refused[0], LeaseHeld) and f"({held[0].holder}, since" in str(refused[0])
    assert open_lease(log.events("c"), "c").token == held[0].token


def test_a_plan_rebuilding_a_lost_sender_log_state_runs_while_the_blocks_it_needs_are_kept(store: StoreConfig) -> None:
    """total (sender-side logs, at_end over ingest) kept its state in scratch; the disk is lost
    after epoch 3 and total's epoch 4 failed. The plan keeps total's epochs 1-3 (epoch 4 rebuilds
    the state from ingest's blocks 1-3), and a replay accepts it: the state is gone, the blocks
    are not. Once a block is collected, the replay refuses the plan, naming the state."""
    import shutil

    from falkirk.plugins.recovery import compute_plan
    from falkirk.plugins.replay.checks import check_still_current
    from falkirk.policies.planning.recovery import PlanError
    from falkirk.policies.regimes import Regime, Tier
    from falkirk.policies.store.ledger import InputRef

    regimes = {"ingest": Regime.parse("batch(log_outputs=true)"),
               "total": Regime.parse("sender_log(release=ingest:at_end, end=10, log_durability=durable)")}
    blocks = store.table_uri(Tier.DURABLE, "s", "ingest", "output")
    state = store.table_uri(Tier.SCRATCH, "s", "total", "state")
    ledger = Ledger(store)
    for e in range(1, 5):
        commit_epoch(blocks, pa.table({"epoch": [e], "x": [e]}), CommitKey(dag_id="s", task_id="ingest", epoch=e))
        ledger.append(LedgerEntry(dag_id="s", task_id="ingest", epoch=e, regime=regimes["ingest"].spec(), run_id=f"epoch-{e}", try_number=1, notified_through=e,
                                  outputs=(OutputRef("output", blocks, "durable", e - 1, 1),)))
        if e < 4:
            commit_epoch(state, pa.table({"epoch": [e], "total": [e]}), CommitKey(dag_id="s", task_id="total", epoch=e))
            ledger.append(LedgerEntry(dag_id="s", task_id="total", epoch=e, regime=regimes["total"].spec(), run_id=f"epoch-{e}", try_number=1, notified_through=e,
                                      state_uri=state, state_tier="scratch", state_version=e - 1, state_rows=1,
                                      inputs=(InputRef(task_id="ingest", output="output", through=e),)))
    shutil.rmtree(state)

    plan = compute_plan("s", store, [FailedTask("total", 4)], regimes, record=False)
    assert (plan.task("total").kept_through, plan.task("total").rerun) == (3, (4,))
    assert plan.task("total").restore_from.epoch == 3 and plan.task("ingest").rerun == ()
    check_still_current(plan, store, LedgerSnapshot(ledger, "s"), resuming=False)

    open_table(blocks).delete("epoch = 2")  # what a collection does to the table
    with pytest.raises(PlanError, match=f"can no longer run: it restores or re-reads total's state of epoch 3 at "
                                        f"{state}, which the store no longer holds"):
        check_still_current(plan, store, LedgerSnapshot(ledger, "s"), resuming=True)


def test_a_replay_computes_its_plan_again_under_the_lease_only_when_the_ledger_or_the_log_changed(
        store: StoreConfig, monkeypatch) -> None:
    """The checks before the lease compute the plan again from the snapshot they read. Under the
    lease it is computed again only if something the lease excludes happened in between: a
    commit to the DAG's ledger, or a collection (or another recovery, or a plan) of the DAG in
    the recovery log. The ledger (``batch`` source and model, model's epoch 4 failed) and the log
    are real tables; the Airflow client answers the dry-run clears only (a stand-in, named so)."""
    from falkirk.plugins.recovery import compute_plan
    from falkirk.plugins.replay import checks
    from falkirk.plugins.replay.executor import check_replay
    from falkirk.policies.regimes import Regime

    class DryRunsOnly:
        """A stand-in for Airflow's REST API: every dry-run clear allowed."""

        def clear(self, dag_id, run_id, tasks, dry_run=False):
            assert dry_run
            return []

    regimes = {"source": Regime.parse("batch"), "model": Regime.parse("batch")}
    ledger = Ledger(store)
    for e in range(1, 5):
        for task in ("source", "model")[:1 if e == 4 else 2]:  # epoch 4's run is known by source's row
            ledger.append(LedgerEntry(dag_id="d", task_id=task, epoch=e, regime="batch", run_id=f"epoch-{e}",
                                      try_number=1))
    plan = compute_plan("d", store, [FailedTask("model", 4)], regimes, last_epoch=4)
    replans = []
    real = checks.compute_plan
    monkeypatch.setattr(checks, "compute_plan", lambda *a, **k: replans.append(1) or real(*a, **k))
    log = RecoveryLog(store)

    def leased_after(between) -> bool:
        checked = check_replay(plan.plan_id, store, DryRunsOnly())
        between()
        lease = log.begin(plan, "replay")
        checked.snapshot.refresh()
        log.end(lease, "failed", "not carried out: this test only takes the lease")
        return checked.unchanged_under(lease)

    assert leased_after(lambda: None) and len(replans) == 1  # the checks' own computation only
    gc = lambda: log.end(log.begin_collection("d", "gc"), "finished", "0 tables")  # noqa: E731
    assert not leased_after(gc)
    assert not leased_after(lambda: ledger.append(LedgerEntry(dag_id="d", task_id="model", epoch=5, regime="batch",
                                                              run_id="epoch-5", try_number=1)))
