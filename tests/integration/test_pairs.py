"""Process pairs through Airflow: a replica fails, its twin takes over, nothing re-runs.

``pairs_a``, a copy of ``dags/falkirk_pairs.py`` (Flux's running example: ``sessions`` and
``stats``, each 4 partitions run as replicas A and B), runs on Airflow (LocalExecutor, jobs
as Spark Connect clients). Replica ``sessions[1].A`` (task instance ``sessions[2]``) dies
before its commit of epoch 2, for real (SIGKILL at the crash point). Its readers do not wait:
``stats`` reads partition 1 of epoch 2 from ``sessions[1].B``. Epoch 3's ``sessions[1].A``
waits on its failed predecessor until ``falkirk pairs --fail-replica`` declares it dead and
skips it; epoch 3 then completes. ``falkirk pairs --catch-up`` recreates the replica from its
twin's state of epoch 3; it commits epoch 4 and folds back in, and the ``stats`` replicas A
read their own replica id again. Nothing re-runs (every task instance ran once, every ledger
row is incarnation 0), the sink holds Flux's five rows exactly once each, and every table
equals a failure-free run's.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from devstack.airflow import AirflowStack
from devstack.demo import dag_epoch_clock, run_id_of
from devstack.inprocess import run_reference_process
from devstack.spark import SparkConnectServer
from falkirk.policies.ids import ReplicaId
from falkirk.plugins.pairs import catch_up, take_over
from falkirk.plugins.recovery import plan, replay
from falkirk.policies.partitions import processors
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import open_table, scan
from falkirk.policies.store.control import PairLayouts
from falkirk.policies.store.ledger import Ledger
from falkirk.spark_jobs.pairs import sink_uri
from tests.integration.recovery.drill import wait_states
from tests.integration.test_falkirk_view import browser, login, open_view, shot  # noqa: F401 (browser: a fixture)
from tests.oracle import canonical

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
A, REF = "pairs_a", "pairs_ref"
DA, DB = "pairs_da", "pairs_db"  # mode D: sessions[0] dies in epoch 2 before any commit (a), after its outputs (b)
DAG_FILE = '''"""Airflow DAG file: a copy of dags/falkirk_pairs.py (a DAG factory)."""
import importlib.util

_spec = importlib.util.spec_from_file_location("falkirk_pairs_dag", {path!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
from falkirk.policies import EagerCheckpoint

pairs_a = _module.build_dag("pairs_a")
# Flux's mode D: one copy per partition, a failed partition re-run alone by Airflow's retry.
_durable = {{"sessions": EagerCheckpoint(), "stats": EagerCheckpoint()}}
pairs_da = _module.build_dag("pairs_da", regimes=_durable, retries=1)
pairs_db = _module.build_dag("pairs_db", regimes=_durable, retries=1)
'''
# Flux's required sink content: (sn, app, src, max, avg), each SN once.
SINK = [(3, "http", "a", 5, 5.0), (5, "ftp", "b", 8, 8.0), (6, "http", "a", 5, 4.0), (9, "http", "c", 4, 4.0),
        (10, "http", "a", 7, 5.0)]
LOST = "sessions[2]"  # replica sessions[1].A


def _module():
    spec = importlib.util.spec_from_file_location("falkirk_pairs_dag", ROOT / "dags" / "falkirk_pairs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PAIRS = _module()
PROCESSORS = [p for t, (regime, n) in PAIRS.TASKS.items() for p in processors(t, n, regime.replicas)]
SUCCESS = {p: {"success"} for p in PROCESSORS}


@pytest.fixture(scope="module")
def paired(tmp_path_factory: pytest.TempPathFactory, spark_connect: SparkConnectServer):
    root = tmp_path_factory.mktemp("pairs")
    store = StoreConfig(str(root / "durable"), str(root / "scratch"))
    dags = root / "dags"
    dags.mkdir()
    (dags / "pairs.py").write_text(DAG_FILE.format(path=str(ROOT / "dags" / "falkirk_pairs.py")))
    faults = root / "faults"
    # S3: sessions[0]'s epoch 2 in mode D dies (a) before any commit, (b) between its outputs and its
    # state; each fires once, its retry runs through
    faults.write_text(f"{A}/{LOST}:2:before-commit\n{DA}/sessions[0]:2:before-commit:once\n"
                      f"{DB}/sessions[0]:2:after-outputs:once\n")
    stack = AirflowStack(home=root / "airflow", store=store, dags_folder=dags, extra_env={
        **spark_connect.airflow_env(), "FALKIRK_CRASH_AT": f"@{faults}"})
    stack.init()
    stack.start()
    try:
        client = stack.client()
        clock = dag_epoch_clock(ROOT / "dags" / "falkirk_pairs.py")
        for dag in (A, DA, DB):
            client.wait_for_dag(dag)
            client.set_paused(dag, False)
        for e in (1, 2, 3):
            client.trigger(A, run_id_of(e), clock.logical_date(e))
        for dag in (DA, DB):
            for e in (1, 2):
                client.trigger(dag, run_id_of(e), clock.logical_date(e))
        run_reference_process(str(ROOT / "dags" / "falkirk_pairs.py"), REF, "falkirk.spark_jobs.sessions", 5,
                              {**store.env(), "SPARK_REMOTE": spark_connect.url})
        # stats reads around the failed replica (all_done); epoch 3's sessions wait on it (depends_on_past
        # waits on every map index of a mapped task)
        waiting = {**SUCCESS, **{p: {None, "scheduled"} for p in PROCESSORS if p != "ingress"}}
        wait_states(client, A, {1: SUCCESS, 2: {**SUCCESS, LOST: {"failed"}}, 3: waiting}, timeout=1200)
        for dag in (DA, DB):
            for e in (1, 2):
                assert client.wait_for_run(dag, run_id_of(e), timeout=900) == "success"
        faults.write_text("")
        # Airflow set epoch 2's run to success (its readers went on) with the replica failed and no
        # row of it: a failure `falkirk plan --failed-task sessions` finds (epoch 3 waits on it).
        assert client.wait_for_run(A, run_id_of(2), timeout=120) == "success"
        unsettled = plan(A, store, client, failed_tasks=["sessions"], record=False)
        before = PairLayouts(store).load(A)
        took = take_over(A, store, client, replica="sessions[1].A", reason="its task instance failed")
        wait_states(client, A, {3: {**SUCCESS, LOST: {"skipped"}}}, timeout=900)
        # S6: the first catch-up, onto spare-1, is killed after copying epoch 2's tables, and
        # spare-1 is lost: its take-over discards the standby; the survivors process epoch 4;
        # the catch-up runs again, onto spare-2.
        faults.write_text(f"{A}/catch-up:2:after-copy\n")
        killed = subprocess.run(
            [sys.executable, "-m", "falkirk.plugins.cli", "pairs", "--dag", A, "--catch-up", "--spare", "spare-1"],
            env={**os.environ, **store.env(), "FALKIRK_AIRFLOW_URL": stack.base_url, "FALKIRK_AIRFLOW_USER": "admin",
                 "FALKIRK_AIRFLOW_PASSWORD": "admin", "FALKIRK_CRASH_AT": f"@{faults}"},
            capture_output=True, text=True, timeout=600)
        faults.write_text("")
        half = PairLayouts(store).load(A).replica("sessions", 1, "A")
        spare_lost = take_over(A, store, client, worker="spare-1", reason="lost during the catch-up")
        client.trigger(A, run_id_of(4), clock.logical_date(4))
        wait_states(client, A, {4: {**SUCCESS, LOST: {"skipped"}}}, timeout=900)
        caught = catch_up(A, store, client, spare="spare-2")
        # Both replicas of stats[2] die in epoch 5: the epoch is not done (its run fails), the
        # take-over skips nothing; the durable path restores the partition alone.
        faults.write_text(f"{A}/stats[4]:5:before-commit\n{A}/stats[5]:5:before-commit\n")
        client.trigger(A, run_id_of(5), clock.logical_date(5))
        wait_states(client, A, {5: {**SUCCESS, "stats[4]": {"failed"}, "stats[5]": {"failed"}}}, timeout=900)
        faults.write_text("")
        assert client.wait_for_run(A, run_id_of(5), timeout=120) == "failed"
        both = take_over(A, store, client, replica="stats[2].A", reason="failed")
        both = (both, take_over(A, store, client, replica="stats[2].B", reason="failed"))
        durable = plan(A, store, client, failed_instances=[("stats[4]", 5), ("stats[5]", 5)])
        replay(durable.plan_id, store, client, progress=print)
        state = SimpleState(stack, store, client, before, took, caught, both, durable, killed, half, spare_lost)
        state.unsettled = unsettled
        yield state
    finally:
        stack.stop()


class SimpleState:
    def __init__(self, stack, store, client, before, took, caught, both, durable, killed, half,  # noqa: ANN001
                 spare_lost) -> None:  # noqa: ANN001
        self.stack, self.store, self.client = stack, store, client
        self.before, self.took, self.caught, self.both, self.durable = before, took, caught, both, durable
        self.killed, self.half, self.spare_lost = killed, half, spare_lost


def test_a_replica_failed_in_a_run_airflow_set_to_success_is_a_failure_to_plan(paired) -> None:
    """Before the take-over, ``plan --failed-task sessions`` plans the failed replica of epoch 2,
    whose run succeeded: a failed instance of a successful run is settled (a refused second run of
    a redone epoch) only when the ledger holds its epoch's row."""
    assert [(str(f.task_id), f.epoch) for f in paired.unsettled.failures] == [(LOST, 2)]
    assert (LOST, 2) in {(str(t), e) for t, e in paired.unsettled.rerun_set()}


def test_the_take_over_skips_the_dead_replica_and_nothing_re_runs(paired) -> None:
    assert paired.took.dead == ("sessions[1].A",)
    assert sorted(paired.took.skipped) == [(run_id_of(2), LOST), (run_id_of(3), LOST)]
    runs = paired.client.task_instances_by_run(A)
    # every task instance ran once: the twin's outputs were read, nothing was retried or cleared
    # (the recreated replica's epoch 4 is its first try too)
    # (but for epoch 5's stats[2], both of whose replicas died: the durable path re-ran them)
    assert {(run, p): ti["try_number"] for run, tis in runs.items() for p, ti in tis.items() if ti["try_number"] > 1} == {
        (run_id_of(5), "stats[4]"): 2, (run_id_of(5), "stats[5]"): 2}
    assert all(paired.client.dag_run(A, run_id_of(e))["state"] == "success" for e in (1, 2, 3, 4, 5))
    rows = Ledger(paired.store).entries(A)
    assert {r.incarnation for r in rows} == {0}
    # the dead replica committed epoch 1, then its copies of the epochs it missed (from its twin), then 5
    assert sorted((r.epoch, r.run_id) for r in rows if r.processor == LOST) == [
        (1, run_id_of(1)), (2, f"catch-up:{run_id_of(2)}"), (3, f"catch-up:{run_id_of(3)}"),
        (4, f"catch-up:{run_id_of(4)}"), (5, run_id_of(5))]


def test_readers_switch_to_the_twin_and_back_after_the_fold_in(paired) -> None:
    rows = Ledger(paired.store).entries(A)
    read = {(r.map_index, r.epoch): sorted(i.map_index for i in r.inputs if i.task_id == "sessions" and i.through ==
                                           r.epoch) for r in rows if r.task_id == "stats"}
    for p in range(4):
        a, b = ReplicaId(task="_", partition=p, replica="A").map_index, ReplicaId(task="_", partition=p, replica="B").map_index
        assert read[a, 1] == [0, 2, 4, 6] and read[b, 1] == [1, 3, 5, 7]
        assert read[a, 2] == read[a, 3] == read[a, 4] == [0, 3, 4, 6], \
            "replicas A read partition 1 from its B while A was dead"
        assert read[a, 5] == [0, 2, 4, 6], "after the fold-in, replicas A read their own replica id again"
        assert read[b, 2] == [1, 3, 5, 7]


def test_the_layout_records_the_take_over_and_the_catch_up(paired) -> None:
    layout = PairLayouts(paired.store).load(A)
    r = layout.replica("sessions", 1, "A")
    assert (r.status.value, r.generation, r.worker) == ("ACTIVE", 4, "spare-2")
    restored = layout.pair("stats", 2)
    assert [(x.status.value, x.generation) for x in restored] == [("ACTIVE", 2), ("ACTIVE", 2)]
    assert all(x.status.value == "ACTIVE" and x.generation == 0 for x in layout.replicas
               if x is not r and x not in restored)
    table = open_table(PairLayouts(paired.store).uri)
    history = sorted((row["generation"], row["status"], row["worker"])
                     for row in scan(table, where={"dag_id": A}).to_pylist()
                     if (row["task_id"], row["partition"], row["replica"]) == ("sessions", 1, "A"))
    # taken over; a standby on spare-1, discarded when spare-1 was lost; another on spare-2, folded in
    assert [(g, status) for g, status, _ in history] == [(0, "ACTIVE"), (1, "DEAD"), (2, "STDBY"), (3, "DEAD"),
                                                          (4, "ACTIVE"), (4, "STDBY")]
    assert [w for g, _, w in history if g >= 2] == ["spare-1", "spare-1", "spare-2", "spare-2"]
    [copied] = paired.caught.replicas
    assert (copied["replica"], copied["epoch"], copied["epochs"], copied["cleared"]) == ("sessions[1].A", 4,
                                                                                         [2, 3, 4], [])
    # sessions[1] holds no open session after epoch 2: its copied state of epoch 3 is empty, like its epoch-3 output
    assert (copied["from"], copied["rows"]) == ("sessions[3]", {"output": 0, "state": 0})
    shown = subprocess.run([sys.executable, "-m", "falkirk.plugins.cli", "pairs", "--dag", A], capture_output=True,
                           text=True, env={**os.environ, **paired.store.env()}, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "sessions[1].A" in shown.stdout and shown.stdout.count("ACTIVE") == 16


def test_a_catch_up_killed_on_a_spare_that_is_lost_is_discarded_and_retried_on_another(paired) -> None:
    """Scenario S6: the killed catch-up left its standby registered on spare-1 with
    epoch 2's tables copied and no ledger row; losing spare-1 discarded it; the survivors ran
    epoch 4 meanwhile; the retry on spare-2 committed each copied epoch once."""
    assert paired.killed.returncode == -9, paired.killed.stderr[-2000:]
    assert "injected crash: catch-up epoch 2 at after-copy" in paired.killed.stderr
    assert (paired.half.status.value, paired.half.worker, paired.half.generation) == ("STDBY", "spare-1", 2)
    assert paired.spare_lost.dead == ("sessions[1].A",) and paired.spare_lost.skipped == ()
    assert paired.client.task_instances(A, run_id_of(4))[LOST]["state"] == "skipped"
    from falkirk.policies.regimes import Tier

    for table in ("output", "state"):  # one commit per epoch, as the failure-free run's: the copy of 2 once
        ours, ref = (open_table(paired.store.table_uri(Tier.DURABLE, dag, "sessions", table, 2)) for dag in (A, REF))
        assert ours.version() == ref.version(), (table, ours.history(), ref.history())
    rows = [r for r in Ledger(paired.store).entries(A, include_invalidated=True) if r.processor == LOST]
    assert sorted(r.epoch for r in rows) == [1, 2, 3, 4, 5] and {r.incarnation for r in rows} == {0}


def test_the_view_shows_each_replica_and_the_take_overs_and_catch_ups(paired, browser) -> None:
    """The Falkirk view's process-pairs panel: every replica with its worker, status and
    generation; the history of sessions[1].A, from its take-over to its fold-in on spare-2."""
    context, page = login(browser, SimpleNamespace(stack=paired.stack), "admin")
    try:
        open_view(page, SimpleNamespace(stack=paired.stack), A)
        page.get_by_test_id("panel-pairs").wait_for(timeout=60_000)
        replicas = page.eval_on_selector_all("[data-testid^='pair-'][data-status]",
                                             "els => els.map(e => [e.dataset.testid, e.dataset.status])")
        assert len(replicas) == 16 and {status for _, status in replicas} == {"ACTIVE"}
        assert page.get_by_test_id("pair-sessions[1].A").get_attribute("data-worker") == "spare-2"
        events = page.eval_on_selector_all("[data-testid=pair-event]",
                                           "els => els.map(e => [e.dataset.replica, e.dataset.what])")
        assert [what for replica, what in events if replica == "sessions[1].A"] == [
            "taken over", "standby registered", "standby discarded", "standby registered", "folded in"]
        # both replicas of stats[2] lost in epoch 5, then restored on the durable path
        assert [what for replica, what in events if replica == "stats[2].A"] == [
            "taken over", "restored on the durable path"]
        shot(page, "pairs-panel")
    finally:
        context.close()


@pytest.mark.parametrize("dag", [DA, DB], ids=["a-before-any-commit", "b-after-the-outputs"])
def test_s3_mode_d_reruns_the_failed_partition_alone(paired, dag: str) -> None:
    """Scenario S3: sessions[0] of epoch 2 crashed (a) before any commit, (b) after
    committing its outputs and before its state; Airflow's retry re-ran that task instance alone,
    from its state of epoch 1; stats of epoch 2 ran once, after it; the sink holds SN 10 once."""
    tries = {(run, p): ti["try_number"] for run, tis in paired.client.task_instances_by_run(dag).items()
             for p, ti in tis.items()}
    assert len(tries) == 2 * 9
    assert {k: n for k, n in tries.items() if n != 1} == {(run_id_of(2), "sessions[0]"): 2}
    rows = Ledger(paired.store).entries(dag)
    assert {r.incarnation for r in rows} == {0} and len(rows) == 18
    assert [(r.try_number, r.state_rows) for r in rows if (r.processor, r.epoch) == ("sessions[0]", 2)] == [(2, 0)]
    sink = []
    for p in range(4):
        table = open_table(sink_uri(paired.store, dag, "stats", p))
        sink += scan(table).to_pylist() if table is not None else []
    assert sorted((r["sn"], r["app"], r["src"], r["longest"], r["avg"]) for r in sink) == SINK
    from falkirk.policies.regimes import Tier

    for table in ("output", "state"):  # (b): the retry's write of the committed outputs was a no-op
        ours = open_table(paired.store.table_uri(Tier.DURABLE, dag, "sessions", table, 0))
        ref = open_table(paired.store.table_uri(Tier.DURABLE, REF, "sessions", table, 0))
        assert len(ours.history()) == 2, (table, ours.history())  # epochs 1 and 2, each committed once
        assert canonical(scan(ours).to_pylist()) == canonical([r for r in scan(ref).to_pylist() if r["epoch"] <= 2])


def test_the_sink_holds_each_update_once_and_every_row_of_stats_names_it_delivered(paired) -> None:
    """Each replica's ledger row names its partition's egress table, as accepted by it (an
    external output, recorded delivered at the commit): nothing in the store is outside what the
    ledger names, and no epoch of stats waits for a delivery (which would make it no checkpoint)."""
    from falkirk.policies.planning.chains import sent_undelivered
    from falkirk.policies.store.control import Deliveries
    from falkirk.policies.store.ledger import external_uri
    from falkirk.policies.store.readability import StoreReadability

    rows = []
    for p in range(4):
        table = open_table(sink_uri(paired.store, A, "stats", p))
        rows += scan(table).to_pylist() if table is not None else []
    assert sorted((r["sn"], r["app"], r["src"], r["longest"], r["avg"]) for r in rows) == SINK
    stats = [r for r in Ledger(paired.store).entries(A) if r.task_id == "stats"]
    assert {(r.map_index, r.epoch): [(o.uri, o.tier) for o in r.outputs if o.name == "sink"] for r in stats} == {
        (r.map_index, r.epoch): [(external_uri(sink_uri(paired.store, A, "stats", r.map_index // 2)), "external")]
        for r in stats}
    assert Deliveries(paired.store).through(A) == {"stats": 5}
    assert [r.key for r in stats if sent_undelivered(r, StoreReadability(paired.store))] == []


def test_every_table_equals_the_failure_free_run(paired) -> None:
    store = paired.store
    compared = 0
    for task, (regime, n) in PAIRS.TASKS.items():
        for index in range(n * regime.replicas) if n else (-1,):
            for table in ("output", "state") if regime.keeps_state else ("output",):
                ref, got = (_rows(store, dag, task, table, index) for dag in (REF, A))
                assert got == ref, f"{task}[{index}] {table} differs from the failure-free run"
                compared += len(ref)
    assert compared == 58  # sessions hold no open session at an epoch's end; stats hold and emit rows
    # both replicas of every partition hold the same state at epochs 4 and 5
    for task in ("sessions", "stats"):
        for p in range(4):
            a, b = (_rows(store, A, task, "state", ReplicaId(task="_", partition=p, replica=r).map_index) for r in "AB")
            assert [x for x in a if dict(x)["epoch"] >= 4] == [x for x in b if dict(x)["epoch"] >= 4]


def test_a_collection_reads_the_history_of_a_take_over_and_a_catch_up(paired) -> None:
    """The readers read partition 1 from its twin while its replica was taken over, then from
    their own again: a collection plans over that history (in a dry run: the tests after this
    one read every epoch). The unit test of a reader's chain across a take-over
    (``tests/unit/test_pairs.py``) has the history the soak met, where it did not."""
    from falkirk.policies.planning.collector import collect

    report = collect(paired.store, A, dry_run=True)
    assert report.dry_run and not report.plan.empty


def test_both_replicas_lost_the_epoch_is_not_done_until_the_durable_path_restores_the_partition(paired) -> None:
    took_a, took_b = paired.both
    # the first take-over skips stats[2].A (its twin still counted as alive); the second finds both
    # dead: nobody holds the partition, so its instance stays failed and no run is settled
    assert (took_a.skipped, took_b.skipped, took_b.settled) == (((run_id_of(5), "stats[4]"),), (), ())
    assert {t.task_id: list(t.rerun) for t in paired.durable.tasks if t.rerun} == {"stats[4]": [5], "stats[5]": [5]}
    assert paired.durable.task("stats[4]").restore_from.epoch == 4


def _rows(store: StoreConfig, dag: str, task: str, table: str, index: int) -> list[tuple]:
    from falkirk.policies.regimes import Tier

    t = open_table(store.table_uri(Tier.DURABLE, dag, task, table, index))
    return canonical(scan(t).to_pylist()) if t is not None else []

