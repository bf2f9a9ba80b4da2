"""The same epoch committed twice leaves the tables and the ledger exactly as after one
commit: a retry that runs after the commit, and a zombie attempt that wrote its files
before another attempt committed and only then tries to commit. Real Spark (in-process,
local) and real Delta tables, the durable tier local and on S3 (``moto_server``).

The zombie is injected deterministically: the first attempt's ``after-files`` point (its
files are written, nothing is committed) runs a whole second attempt to completion
before the first one goes on.
"""

from __future__ import annotations

import pytest

from falkirk.policies import EagerCheckpoint, Ledger, StoreConfig, Tier
from falkirk.policies.job_spec import JobSpec
from falkirk.policies.store.commits import open_table, scan
from falkirk.spark_jobs import runtime
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, commit

DAG = "idem"


@pytest.fixture(autouse=True, params=["executors", "driver"])
def writer(request, monkeypatch) -> str:
    """Both ways an epoch's files get written: by the executors (0: the driver writes none) or the driver."""
    monkeypatch.setenv("FALKIRK_DRIVER_WRITE_MAX_ROWS", "0" if request.param == "executors" else "1000")
    return request.param


def attempt(spark, store: StoreConfig, try_number: int, amount: int) -> tuple[EpochContext, EpochResult]:
    """One attempt at epoch 1 of an eagerly checkpointed task; ``amount`` marks its rows."""
    ctx = EpochContext(JobSpec(dag_id=DAG, task_id="totals", epoch=1, regime=EagerCheckpoint(), run_id="epoch-1", try_number=try_number),
                       store, Ledger(store), spark)
    rows = spark.createDataFrame([("a", amount), ("b", amount)], "customer string, amount long")
    return ctx, EpochResult(outputs={"output": rows}, state=rows)


def tables(store: StoreConfig) -> dict[str, tuple[int, list]]:
    """Each table's Delta version and rows."""
    out = {}
    for name in ("output", "state"):
        uri = store.table_uri(Tier.DURABLE, DAG, "totals", name)
        dt = open_table(uri, store.options_for(uri))
        out[name] = (dt.version(), sorted(scan(dt).to_pylist(), key=str))
    return out


def test_a_retry_after_the_commit_changes_nothing(spark, store: StoreConfig) -> None:
    commit(*attempt(spark, store, try_number=1, amount=10))
    once, ledger_once = tables(store), Ledger(store).read().num_rows

    commit(*attempt(spark, store, try_number=2, amount=99))  # a retry, with rows that differ

    assert tables(store) == once and Ledger(store).read().num_rows == ledger_once == 1
    assert [r["amount"] for r in once["output"][1]] == [10, 10]


def test_a_zombie_attempt_finishing_late_changes_nothing(spark, store: StoreConfig, monkeypatch) -> None:
    real_crash_point = runtime.crash_point
    after_second: dict[str, object] = {}

    def second_attempt_commits_first(task_id: str, epoch: int, step: str, dag_id: str | None = None) -> None:
        if step == "after-files" and not after_second:
            after_second["running"] = True
            monkeypatch.setattr(runtime, "crash_point", real_crash_point)
            commit(*attempt(spark, store, try_number=2, amount=20))
            after_second.update(tables=tables(store), ledger=Ledger(store).read().num_rows)

    monkeypatch.setattr(runtime, "crash_point", second_attempt_commits_first)
    zombie = commit(*attempt(spark, store, try_number=1, amount=10))  # staged, then the other attempt ran

    assert after_second["ledger"] == 1
    assert tables(store) == after_second["tables"]  # the zombie's commits were all skipped
    assert [r["amount"] for r in tables(store)["output"][1]] == [20, 20]
    rows = Ledger(store).entries(DAG)
    assert len(rows) == 1 and rows[0].try_number == 2 and zombie.try_number == 1


def test_two_attempts_at_the_same_instant_commit_once(spark, store: StoreConfig, monkeypatch) -> None:
    """Not a staged zombie: both attempts (of a deterministic job) write their files, wait for
    each other, and commit at once (two threads on one Spark session). Each table and the
    ledger take one commit: no row is doubled, whichever attempt wins each race."""
    import threading

    both_staged = threading.Barrier(2, timeout=300)

    def wait_for_the_other(task_id: str, epoch: int, step: str, dag_id: str | None = None) -> None:
        if step == "after-files":
            both_staged.wait()

    monkeypatch.setattr(runtime, "crash_point", wait_for_the_other)
    results: dict[int, object] = {}

    def run(try_number: int) -> None:
        try:
            results[try_number] = commit(*attempt(spark, store, try_number=try_number, amount=10))
        except BaseException as exc:  # reported below
            results[try_number] = exc

    threads = [threading.Thread(target=run, args=(t,)) for t in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not [r for r in results.values() if isinstance(r, BaseException)], results
    rows = Ledger(store).entries(DAG)
    assert len(rows) == 1 and rows[0].try_number in (1, 2)
    # one commit each: the table's first version, holding one attempt's two rows
    assert tables(store) == {name: (0, [{"amount": 10, "customer": c, "epoch": 1} for c in "ab"])
                             for name in ("output", "state")}
    assert rows[0].state_version == 0 and [o.version for o in rows[0].outputs] == [0]


def running_total(spark, store: StoreConfig, epoch: int, amount: int,
                  incarnation: int = 0) -> tuple[EpochContext, EpochResult]:
    """An attempt at ``epoch`` of a running total: the state restored from epoch - 1 plus ``amount``."""
    ctx = EpochContext(JobSpec(dag_id=DAG, task_id="totals", epoch=epoch, regime=EagerCheckpoint(), run_id=f"epoch-{epoch}", incarnation=incarnation),
                       store, Ledger(store), spark)
    before = ctx.previous_state()
    total = amount + (before.collect()[0]["amount"] if before is not None else 0)
    rows = spark.createDataFrame([("a", total)], "customer string, amount long")
    return ctx, EpochResult(outputs={"output": rows}, state=rows)


def dies_before_its_ledger_row(monkeypatch, spark, store: StoreConfig, epoch: int, amount: int) -> None:
    """Commit an attempt's tables and kill it (``after-state``) before its ledger row."""
    real_crash_point = runtime.crash_point

    class Killed(Exception):
        pass

    def killed_after_state(task_id: str, epoch: int, step: str, dag_id: str | None = None) -> None:
        if step == "after-state":
            raise Killed

    monkeypatch.setattr(runtime, "crash_point", killed_after_state)
    with pytest.raises(Killed):
        commit(*running_total(spark, store, epoch, amount))
    monkeypatch.setattr(runtime, "crash_point", real_crash_point)


def test_an_orphaned_commit_from_inputs_a_recovery_redid_is_replaced(spark, store: StoreConfig, monkeypatch,
                                                                    writer: str) -> None:
    """Epoch 2's first attempt restores epoch 1's state, commits its tables and dies before its
    ledger row. A recovery then redoes epoch 1 (incarnation 1, another total). The retry of epoch
    2, still incarnation 0 (it has no row to invalidate), restores the redone state: its commit
    replaces the dead attempt's tables instead of keeping rows computed from the rolled-back
    state."""
    first = commit(*running_total(spark, store, 1, amount=10))
    dies_before_its_ledger_row(monkeypatch, spark, store, 2, amount=5)
    assert [r["amount"] for r in tables(store)["state"][1] if r["epoch"] == 2] == [15]  # the orphan

    Ledger(store).invalidations.record([first], "plan-redoes-epoch-1")
    commit(*running_total(spark, store, 1, amount=100, incarnation=1))  # the redone epoch 1
    retried = commit(*running_total(spark, store, 2, amount=5))

    for name in ("output", "state"):
        assert [r["amount"] for r in tables(store)[name][1] if r["epoch"] == 2] == [105], name
    assert retried.incarnation == 0 and retried.state_rows == 1
    assert Ledger(store).find(DAG, "totals", 2).state_version == tables(store)["state"][0]


def test_a_stale_attempt_does_not_replace_a_commit_from_current_inputs(spark, store: StoreConfig, monkeypatch,
                                                                       writer: str) -> None:
    """The other way round: the tables hold epoch 2 computed from the redone epoch 1, and an
    attempt still holding the rolled-back state of epoch 1 (a zombie that started before the
    recovery) comes to commit. It is refused, and the tables keep the current rows."""
    first = commit(*running_total(spark, store, 1, amount=10))
    zombie = running_total(spark, store, 2, amount=5)  # restored epoch 1, incarnation 0
    Ledger(store).invalidations.record([first], "plan-redoes-epoch-1")
    commit(*running_total(spark, store, 1, amount=100, incarnation=1))
    dies_before_its_ledger_row(monkeypatch, spark, store, 2, amount=5)  # 105, from the redone state
    current = tables(store)

    with pytest.raises(runtime.RolledBack, match=r"totals epoch 1 was rolled back by a recovery while this epoch ran; "
                                                 r"its commit is not made"):
        commit(*zombie)
    assert tables(store) == current and Ledger(store).find(DAG, "totals", 2) is None


def test_a_zombie_from_other_inputs_does_not_replace_a_commit_with_its_ledger_row(spark, store: StoreConfig,
                                                                                  writer: str) -> None:
    """A zombie that read other rows than the attempt whose commit stands (here: none, where the
    retry restored epoch 1's state) finds that commit's ledger row and changes nothing."""
    commit(*running_total(spark, store, 1, amount=10))
    commit(*running_total(spark, store, 2, amount=5))
    before, ledger_before = tables(store), Ledger(store).read().num_rows

    ctx = EpochContext(JobSpec(dag_id=DAG, task_id="totals", epoch=2, regime=EagerCheckpoint(), run_id="epoch-2", try_number=1), store, Ledger(store),
                       spark)
    rows = spark.createDataFrame([("z", 99)], "customer string, amount long")
    commit(ctx, EpochResult(outputs={"output": rows}, state=rows))

    assert tables(store) == before and Ledger(store).read().num_rows == ledger_before


def test_compactions_racing_on_the_ledger_leave_each_row_once(store: StoreConfig) -> None:
    """Four compactions of the ledger at once, on the local store and on the S3-compatible
    server (whose conditional writes are what makes a claim exclusive there): one claims the
    table and compacts, the others do nothing, and every row is there once."""
    import threading

    from falkirk.policies import LedgerEntry

    ledger = Ledger(store)
    for epoch in range(1, 13):
        ledger.append(LedgerEntry(dag_id="d", task_id="t", epoch=epoch, regime="ephemeral", run_id=f"r{epoch}", try_number=1))
    barrier, removed = threading.Barrier(4), []

    def race() -> None:
        barrier.wait()
        removed.append(ledger.compact())

    racers = [threading.Thread(target=race) for _ in range(4)]
    for t in racers:
        t.start()
    for t in racers:
        t.join(120)
    table = open_table(ledger.uri, store.options_for(ledger.uri))
    assert sorted(r["epoch"] for r in scan(table).to_pylist()) == list(range(1, 13))
    assert sorted(removed) == [0, 0, 0, 12]
    assert [h["operation"] for h in table.history()].count("OPTIMIZE") == 1
