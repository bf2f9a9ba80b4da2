"""Exactly-once delivery from a non-deterministic task, through Airflow: marker pairs.

``dags/falkirk_sampled.py`` runs under Airflow (LocalExecutor, one retry per task instance),
its jobs clients of the session's Spark Connect server, in three copies:

* ``sampled_a`` (marker pairs, ``draw`` declared non-deterministic): epoch 1's ``draw`` is
  SIGKILLed after chunk 3's rows went to the sink and before chunk 3 was saved. Airflow
  retries it; the retry reads chunks 1-2 back from their checkpoints and draws 3-4 again,
  while ``deliver`` runs beside it the whole time. Epochs 2 and 3 run without a failure.
  Then the scratch tier is lost: the plan re-runs ``deliver`` epoch 3 only, and the SQL and
  Delta targets end as first delivered.
* ``sampled_slow`` (slow travellers only, transactions of 8 rows, chunks of ~20): ``deliver``
  stalls with nothing committed while ``draw`` runs, and its log says where; its retry
  delivers the epoch only once ``draw`` has committed it.
* ``sampled_det`` (``draw`` treated as deterministic, its output in scratch): after the
  same loss, the plan draws epoch 1 again and the sink's rows change.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from deltalake import DeltaTable

from devstack.airflow import AirflowStack
from devstack.demo import dag_epoch_clock, run_id_of
from devstack.spark import SparkConnectServer
from falkirk.plugins.recovery import plan, replay
from falkirk.policies.regimes import Tier
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import open_table, scan
from falkirk.policies.store.ledger import Ledger
from falkirk.policies.store.steps import StepLog
from falkirk.spark_jobs import channels
from falkirk.spark_jobs.sampled import CHUNKS, edge_tables
from falkirk.spark_jobs.sampled.targets import SampleTable, SampleTargets

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DAG_PATH = ROOT / "dags" / "falkirk_sampled.py"
A, SLOW, DET = "sampled_a", "sampled_slow", "sampled_det"
CAPACITY = 8
DAG_FILE = '''"""Airflow DAG file: copies of dags/falkirk_sampled.py (a DAG factory), each with tables of its own."""
import importlib.util

_spec = importlib.util.spec_from_file_location("falkirk_sampled_dag", {path!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
sampled_a = _module.build_dag("sampled_a", capacity={capacity})
sampled_slow = _module.build_dag("sampled_slow", markers="slow", capacity={capacity})
sampled_det = _module.build_dag("sampled_det", capacity={capacity}, deterministic=True)
'''


def targets(store: StoreConfig, dag_id: str) -> SampleTargets:
    return SampleTargets(SampleTable.for_dag(store.durable_uri, dag_id),
                         store.table_uri(Tier.DURABLE, dag_id, "deliver", "delivered"))


def logged(store: StoreConfig, dag_id: str, epoch: int, tier: Tier = Tier.DURABLE) -> list[tuple]:
    """draw's committed output of ``epoch``: (epoch, key, value, chunk) in key order."""
    rows = scan(open_table(store.table_uri(tier, dag_id, "draw", "output")), where={"epoch": epoch}).to_pylist()
    return sorted((epoch, r["key"], r["value"], r["chunk"]) for r in rows)


def edge_before_the_rewind(store: StoreConfig, dag_id: str, epoch: int) -> list[dict]:
    """The edge's rows of ``epoch`` as the killed attempt left them (time travel before the delete)."""
    table = DeltaTable(edge_tables(store, dag_id).edge)
    deletes = [h["version"] for h in table.history() if h.get("operation") == "DELETE"]
    table.load_as_version(min(deletes) - 1)
    return [r for r in table.to_pyarrow_table().to_pylist() if r["epoch"] == epoch]


def run_epochs(run, dag_id: str, epochs: list[int]) -> dict[int, str]:
    for e in epochs:
        run.client.trigger(dag_id, run_id_of(e), run.clock.logical_date(e))
    return {e: run.client.wait_for_run(dag_id, run_id_of(e), timeout=1200) for e in epochs}


def last_log(run, dag_id: str, epoch: int, task: str) -> str:
    tries = run.client.task_instances(dag_id, run_id_of(epoch))[task]["try_number"]
    return run.client.task_log(dag_id, run_id_of(epoch), task, tries)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, spark_connect: SparkConnectServer):
    root = tmp_path_factory.mktemp("sampled")
    store = StoreConfig(str(root / "durable"), str(root / "scratch"))
    dags = root / "dags"
    dags.mkdir()
    (dags / "sampled.py").write_text(DAG_FILE.format(path=str(DAG_PATH), capacity=CAPACITY))
    faults = root / "faults"
    faults.write_text(f"{A}/draw:1:chunk-3-after-files:once\n")
    database = str(root / "sql" / "{dag_id}.sqlite")  # the SQL targets, as the tasks and this test find them
    patch = pytest.MonkeyPatch()
    patch.setenv("FALKIRK_QUERY_DB", database)
    stack = AirflowStack(home=root / "airflow", store=store, dags_folder=dags, parallelism=6, extra_env={
        **spark_connect.airflow_env(), "FALKIRK_CRASH_AT": f"@{faults}", "FALKIRK_EDGE_STALL_SECONDS": "8",
        "FALKIRK_QUERY_DB": database})
    stack.init()
    stack.start()
    try:
        client = stack.client()
        for dag_id in (A, SLOW, DET):
            client.wait_for_dag(dag_id)
            client.set_paused(dag_id, False)
        run = SimpleNamespace(store=store, client=client, clock=dag_epoch_clock(DAG_PATH), root=root)
        run.states = {A: run_epochs(run, A, [1])}
        run.first = {e: targets(store, A).sql.rows(e) for e in (1,)}
        run.states[SLOW] = run_epochs(run, SLOW, [1])  # alone: its two tasks start together
        client.trigger(DET, run_id_of(1), run.clock.logical_date(1))  # beside sampled_a's epochs 2-3
        run.states[A].update(run_epochs(run, A, [2, 3]))
        run.states[DET] = {1: client.wait_for_run(DET, run_id_of(1), timeout=1200)}
        run.tis = {(d, e): client.task_instances(d, run_id_of(e)) for d, es in run.states.items() for e in es}
        run.logs = {(t, n): client.task_log(A, run_id_of(1), t, n) for t in ("draw", "deliver")
                    for n in range(1, run.tis[A, 1][t]["try_number"] + 1)}
        run.faults_left = faults.read_text()
        yield run
    finally:
        stack.stop()
        patch.undo()


def test_the_killed_producer_was_retried_and_the_sink_ran_beside_it(run) -> None:
    assert run.states[A] == {1: "success", 2: "success", 3: "success"}
    assert run.faults_left.strip() == ""
    assert {t: ti["try_number"] for t, ti in run.tis[A, 1].items()} == {"draw": 2, "deliver": 1}
    assert "injected crash: draw epoch 1 at chunk-3-after-files" in run.logs["draw", 1]
    retry = run.logs["draw", 2]
    assert "draw epoch 1: resuming at chunk 2 of 4 from its checkpoint" in retry
    assert "edge epoch 1: attempt 2 keeps chunks 1-2 as sent and withdraws" in retry
    assert "attempt 2 of the producer keeps chunks 1-2;" in run.logs["deliver", 1]
    # the ledger records the edge the DAG does not: deliver read draw's epoch (M̄)
    entry = Ledger(run.store).find(A, "deliver", 1)
    assert [(i.task_id, i.output, i.through) for i in entry.inputs] == [("draw", "output", 1)]
    assert Ledger(run.store).find(A, "draw", 1).try_number == 2


def test_the_sink_holds_every_drawn_row_exactly_once_in_both_targets(run) -> None:
    t = targets(run.store, A)
    for e in (1, 2, 3):
        rows = logged(run.store, A, e)
        assert len(rows) > 3 * CAPACITY, "an epoch must be larger than a transaction"
        assert t.sql.rows(e) == rows, f"epoch {e}: the SQL table differs from draw's logged output"
        assert sorted((e, r["key"], r["value"], r["chunk"]) for r in t.delta_rows(e)) == rows
    assert run.first[1] == logged(run.store, A, 1)
    edge = edge_tables(run.store, A)
    assert [channels.rows(edge.edge, epoch=e) + channels.rows(edge.control, epoch=e) for e in (1, 2, 3)] == [[]] * 3


def test_the_sink_committed_in_small_transactions_while_the_producer_ran(run) -> None:
    t = targets(run.store, A)
    steps = {(c.epoch, c.step): c.committed_at.timestamp() for c in StepLog(run.store).of_dag(A)
             if c.task_id == "draw"}
    for e in (1, 2, 3):
        txns = t.sql.transactions(e)
        assert all(rows <= CAPACITY - 1 for _, _, _, rows, _ in txns), txns  # one slot is the fast traveller's
        assert len(txns) >= len(logged(run.store, A, e)) // (CAPACITY - 1)
        # the first commit came before the last chunk was even saved
        assert txns[0][4] < steps[e, CHUNKS], f"epoch {e}: nothing was committed while draw ran"


def test_every_row_was_committed_after_its_determinants_were_saved(run) -> None:
    """The bounded-pipeline oracle (falkirk.policies.marker_pairs) on the real run: a row's transaction began after its chunk's checkpoint
    (the step log's commit point) of the attempt that drew it."""
    t = targets(run.store, A)
    saved: dict[tuple[int, int], float] = {}
    for c in StepLog(run.store).of_dag(A):
        if c.task_id == "draw":  # the first attempt that saved the chunk
            saved[c.epoch, c.step] = min(saved.get((c.epoch, c.step), float("inf")), c.committed_at.timestamp())
    for e in (1, 2, 3):
        for key, chunk, _, committed_at in t.sql.with_commit_times(e):
            assert saved[e, chunk] <= committed_at, f"{key} (chunk {chunk}) committed before it was saved"


def test_the_killed_attempts_unsaved_chunk_was_drawn_anew_and_never_committed(run) -> None:
    before = edge_before_the_rewind(run.store, A, 1)
    dead = {r["key"]: r["value"] for r in before if r["kind"] == "data" and r["chunk"] == 3 and r["attempt"] == 1}
    assert dead, "the killed attempt sent chunk 3's rows before it died"
    final = {k: v for _, k, v, c in logged(run.store, A, 1) if c == 3}
    assert dead != final  # a real non-deterministic task: the redraw differs
    committed = {k: v for _, k, v, c in targets(run.store, A).sql.rows(1) if c == 3}
    assert committed == final


def test_slow_travellers_alone_stall_the_sink_until_the_epoch_is_over(run) -> None:
    """Without fast travellers the sink's first try, running beside draw, commits nothing and
    says where it is stuck; Airflow's retry, once draw's epoch is committed (all of it
    vouched for), delivers it: the rows wait for the end of the epoch, as without markers."""
    assert run.states[SLOW] == {1: "success"}
    tis = run.tis[SLOW, 1]
    assert (tis["draw"]["try_number"], tis["deliver"]["try_number"]) == (1, 2)
    stalled = run.client.task_log(SLOW, run_id_of(1), "deliver", 1)
    assert f"stalled: the open transaction holds {CAPACITY} of {CAPACITY} rows (chunks [1]) and may commit none " \
           "of them until the slow traveller of chunk 1 arrives, which waits behind them" in stalled, stalled
    assert f"deliver epoch 1: draw is committed; delivering {len(logged(run.store, SLOW, 1))} rows of its logged " \
           "output" in last_log(run, SLOW, 1, "deliver")
    t = targets(run.store, SLOW)
    draw_committed = Ledger(run.store).find(SLOW, "draw", 1).committed_at.timestamp()
    assert [d for _, d, *_ in t.sql.transactions()] and {d for _, d, *_ in t.sql.transactions()} == {"0.2"}
    assert min(at for *_, at in t.sql.transactions()) > draw_committed
    assert t.sql.rows() == logged(run.store, SLOW, 1)


def test_after_scratch_is_lost_the_sink_redelivers_exactly_what_it_first_delivered(run) -> None:
    t = targets(run.store, A)
    first = t.sql.rows()
    first_delta = sorted((r["epoch"], r["key"], r["value"], r["chunk"]) for r in t.delta_rows())
    shutil.rmtree(f"{run.store.scratch_uri}/{A}")  # deliver's state of epochs 1 and 3, the edge
    p = plan(A, run.store, run.client, lost_scratch=[f"{run.store.scratch_uri}/{A}"])
    print(p.table())
    # draw's output is logged: it is not drawn again; deliver restores its durable state of epoch 2
    assert {x.task_id: list(x.rerun) for x in p.tasks if x.rerun} == {"deliver": [3]}
    replay(p.plan_id, run.store, run.client, progress=print)
    assert run.client.wait_for_run(A, run_id_of(3), timeout=1200) == "success"
    log = last_log(run, A, 3, "deliver")
    assert f"deliver epoch 3: draw is committed; delivering {len(logged(run.store, A, 3))} rows of its logged " \
           "output" in log
    assert t.sql.rows() == first
    assert sorted((r["epoch"], r["key"], r["value"], r["chunk"]) for r in t.delta_rows()) == first_delta == first
    redelivered = [x for x in t.sql.transactions(3) if x[1].startswith("1.")]
    assert redelivered and all(rows <= CAPACITY for *_, rows, _ in redelivered)
    assert Ledger(run.store).find(A, "deliver", 3).incarnation == 1


def test_treated_as_deterministic_a_recovery_changes_what_was_delivered(run) -> None:
    assert run.states[DET] == {1: "success"}
    t = targets(run.store, DET)
    first = t.sql.rows()
    assert first == logged(run.store, DET, 1, Tier.SCRATCH)
    shutil.rmtree(f"{run.store.scratch_uri}/{DET}")  # draw's output and deliver's state
    p = plan(DET, run.store, run.client, lost_scratch=[f"{run.store.scratch_uri}/{DET}"])
    print(p.table())
    assert {x.task_id: list(x.rerun) for x in p.tasks if x.rerun} == {"deliver": [1], "draw": [1]}
    replay(p.plan_id, run.store, run.client, progress=print)
    assert run.client.wait_for_run(DET, run_id_of(1), timeout=1200) == "success"
    again = t.sql.rows()
    assert again == logged(run.store, DET, 1, Tier.SCRATCH)  # exactly once, of the new draw
    assert again != first  # but not what its readers saw before
