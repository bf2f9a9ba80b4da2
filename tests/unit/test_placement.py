"""Workers: scratch groups, a group's home worker, and a lost worker as a failure the planner takes.

A lost worker must plan exactly as losing the scratch tables the ledger says it held:
the property tests compare plans for ``LostWorker`` with plans for ``LostScratch`` of that
worker's directory, whose re-run sets ``test_recovery`` checks against a brute-force oracle.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings, strategies as st

from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, LazyCheckpoint
from falkirk.policies.placement import configured_workers, home_worker, lost_workers, scratch_groups
from falkirk.policies.planning.chains import DataEdge, TaskGraph
from falkirk.policies.planning.monitor import acknowledged_inputs
from falkirk.policies.planning.recovery import FailedTask, LostScratch, LostWorker, RecoveryPlan, lost_locations, plan_recovery
from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef
from tests.unit.test_recovery import GRAPH, REGIMES, history, oracle, readable_when

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def on_workers(rows: list[LedgerEntry], worker_of: dict[str, str]) -> list[LedgerEntry]:
    """``rows`` as committed by named workers: scratch URIs under ``/scratch/<worker>/``."""
    placed = []
    for r in rows:
        w = worker_of[r.task_id]
        move = lambda uri: uri.replace("/scratch/", f"/scratch/{w}/", 1) if uri else uri  # noqa: E731
        placed.append(dataclasses.replace(
            r, worker=w, state_uri=move(r.state_uri),
            outputs=tuple(dataclasses.replace(o, uri=move(o.uri)) for o in r.outputs)))
    return placed


def test_scratch_groups_join_tasks_through_scratch_state_and_scratch_edges() -> None:
    # the four-regime pipeline: source keeps its outputs in scratch, so clean must run where it
    # ran; model restores state from scratch; sink is durable and reads model's scratch outputs
    dag = {t: (REGIMES[t], (up,) if up else ()) for t, up in
           (("source", None), ("clean", "source"), ("model", "clean"), ("sink", "model"))}
    assert scratch_groups(dag) == [frozenset({"clean", "source"}), frozenset({"model", "sink"})]
    durable = {"a": (EagerCheckpoint(), ()), "b": (Batch(log_outputs=True), ("a",)), "plain": (None, ("b",))}
    assert scratch_groups(durable) == []
    logged_lazy = {"a": (LazyCheckpoint(every=2, log_outputs=True), ()), "b": (EagerCheckpoint(), ("a",))}
    assert scratch_groups(logged_lazy) == [frozenset({"a"})]
    assert scratch_groups({"e": (Ephemeral(), ()), "f": (None, ("e",))}) == [frozenset({"e", "f"})]


def row(task: str, epoch: int, worker: str | None, minutes: int, tier: str = "scratch") -> LedgerEntry:
    return LedgerEntry(dag_id="d", task_id=task, epoch=epoch, regime="lazy_checkpoint(every=3)", run_id=f"r{epoch}", try_number=1, worker=worker,
                       state_uri=f"/s/{worker}/d/{task}/state", state_tier=tier,
                       committed_at=T0 + timedelta(minutes=minutes))


def test_a_group_stays_on_the_worker_of_its_latest_scratch_checkpoint() -> None:
    group = frozenset({"model"})
    rows = [row("model", 1, "worker-a", 1), row("model", 2, "worker-b", 2)]
    assert home_worker("d", group, rows, ("worker-a", "worker-b")) == "worker-b"
    both = ("worker-a", "worker-b")
    # a durable-only row holds nothing on a worker's disk
    assert home_worker("d", group, [*rows, row("model", 3, "worker-a", 3, tier="durable")], both) == "worker-b"
    # rows of another group or DAG do not move it
    assert home_worker("d", group, [*rows, row("other", 9, "worker-a", 9)], both) == "worker-b"
    # a worker placement does not know (removed from FALKIRK_WORKERS) is not followed
    assert home_worker("d", group, rows, ("worker-a",)) == "worker-a"
    assert home_worker("d", group, rows, ()) is None


def test_a_lost_worker_is_left_until_it_commits_again() -> None:
    group = frozenset({"model"})
    rows = [row("model", 1, "worker-a", 1), row("model", 2, "worker-a", 2)]
    lost = {"worker-a": T0 + timedelta(minutes=5)}
    assert home_worker("d", group, rows, ("worker-a", "worker-b"), lost) == "worker-b"
    assert home_worker("d", group, rows, ("worker-a",), lost) == "worker-a"  # a fresh disk, the only one
    back = [*rows, row("model", 3, "worker-a", 6)]  # committed after the loss: its disk is in use again
    assert home_worker("d", group, back, ("worker-a", "worker-b"), lost) == "worker-a"


def test_a_group_without_checkpoints_is_hashed_onto_a_worker_every_caller_agrees_on() -> None:
    workers = tuple(f"w{i}" for i in range(4))
    groups = [frozenset({f"t{i}"}) for i in range(40)]
    homes = [home_worker("d", g, [], workers) for g in groups]
    assert homes == [home_worker("d", g, [], tuple(reversed(workers))) for g in groups]  # order-free
    assert set(homes) == set(workers)  # spread over every worker
    # removing a worker moves only the groups it had (rendezvous hashing)
    fewer = [home_worker("d", g, [], workers[:3]) for g in groups]
    assert all(a == b for a, b in zip(homes, fewer) if a != "w3")
    assert home_worker("d", groups[0], [], ()) is None
    # the DAG's own queue, when it names a worker, decides before the hash; a checkpoint before both
    assert home_worker("d", groups[0], [], workers, preferred="w2") == "w2"
    assert home_worker("d", groups[0], [], workers, preferred="default") == homes[0]
    assert home_worker("d", frozenset({"model"}), [row("model", 1, "w1", 1)], workers, preferred="w2") == "w1"
    # a lost worker is not preferred: the hash over the others decides
    others = tuple(w for w in workers if w != "w2")
    assert home_worker("d", groups[0], [], workers, lost={"w2": T0}, preferred="w2") == home_worker(
        "d", groups[0], [], others) != "w2"


def test_a_group_whose_workers_were_all_lost_still_has_one_home() -> None:
    """Both workers lost (one after the other, before either committed again): every task of a
    group, whichever queue the DAG gives it, is placed on one worker, the same for every group
    member and every caller."""
    groups = [frozenset({f"t{i}", f"u{i}"}) for i in range(20)]
    workers = ("worker-a", "worker-b")
    rows = [row("t0", 1, "worker-a", 1), row("u0", 1, "worker-b", 2)]
    lost = {"worker-a": T0 + timedelta(minutes=5), "worker-b": T0 + timedelta(minutes=7)}
    for preferred in ("default", "worker-a", "worker-b", None):
        homes = [home_worker("d", g, rows, workers, lost=lost, preferred=preferred) for g in groups]
        assert all(h in workers for h in homes)
        assert homes == [home_worker("d", g, rows, tuple(reversed(workers)), lost=lost, preferred=preferred)
                         for g in groups]
        if preferred in workers:
            assert set(homes) == {preferred}
    assert {home_worker("d", g, rows, workers, lost=lost) for g in groups} == set(workers)  # hashed over both
    # once one of them commits again, the group follows that checkpoint
    back = [*rows, row("u0", 2, "worker-b", 8)]
    assert home_worker("d", groups[0], back, workers, lost=lost, preferred="worker-a") == "worker-b"


def test_lost_workers_come_from_recoveries_that_were_carried_out() -> None:
    plans = {"p1": {"failures": [{"kind": "lost_worker", "worker": "worker-a"}]},
             "p2": {"failures": [{"kind": "failed_task", "task_id": "x", "epoch": 1}]},
             "p3": {"failures": [{"kind": "lost_worker", "worker": "worker-b"}]}}
    events = [{"plan_id": "p1", "event": "started", "recorded_at": T0},
              {"plan_id": "p1", "event": "resumed", "recorded_at": T0 + timedelta(minutes=1)},
              {"plan_id": "p2", "event": "started", "recorded_at": T0},
              {"plan_id": "p3", "event": "planned", "recorded_at": T0}]  # previewed, never executed
    assert lost_workers(events, plans) == {"worker-a": T0 + timedelta(minutes=1)}
    assert configured_workers({"FALKIRK_WORKERS": " a,,b "}) == ("a", "b") and configured_workers({}) == ()


def test_lost_locations_name_only_the_lost_workers_scratch_tables() -> None:
    rows = on_workers(history(3, None), {"source": "worker-a", "clean": "worker-a", "model": "worker-b",
                                         "sink": "worker-b"})
    assert lost_locations([LostWorker("worker-b")], rows) == ("/scratch/worker-b/model/output/",
                                                              "/scratch/worker-b/model/state/")
    assert lost_locations([LostWorker("worker-a")], rows) == ("/scratch/worker-a/source/output/",)
    assert lost_locations([LostWorker("worker-c")], rows) == ()


@settings(max_examples=150, deadline=None)
@given(epochs=st.integers(3, 6), failed=st.one_of(st.none(), st.tuples(st.sampled_from(tuple(REGIMES)),
                                                                        st.integers(1, 6))),
       split=st.booleans(), lost=st.sampled_from(["worker-a", "worker-b"]))
def test_a_lost_worker_plans_as_its_scratch_directory_lost(epochs, failed, split, lost) -> None:
    failed = (failed[0], min(failed[1], epochs)) if failed else None
    worker_of = ({"source": "worker-a", "clean": "worker-a", "model": "worker-b", "sink": "worker-b"} if split
                 else dict.fromkeys(REGIMES, "worker-a"))
    rows = on_workers(history(epochs, failed), worker_of)
    extra = [FailedTask(*failed)] if failed else []
    by_worker = plan_recovery("pipe", GRAPH, rows, [*extra, LostWorker(lost)], epochs, readable_when(False), REGIMES)
    by_dir = plan_recovery("pipe", GRAPH, rows, [*extra, LostScratch(f"/scratch/{lost}")], epochs,
                           readable_when(False), REGIMES)
    assert by_worker.rerun_set() == by_dir.rerun_set()
    assert {t.task_id: t.kept_through for t in by_worker.tasks} == {t.task_id: t.kept_through for t in by_dir.tasks}
    assert by_worker.clear_downstream_set() == by_dir.clear_downstream_set()
    if not split and lost == "worker-a" and failed is None:  # the whole scratch tier: the oracle's case
        frontiers, redo = oracle(history(epochs, None), epochs, None, scratch_lost=True)
        assert by_worker.rerun_set() == redo
    again = RecoveryPlan.from_json(by_worker.to_json())
    assert again == by_worker and "lost worker " + lost in by_worker.table()


@pytest.mark.parametrize("lost, rerun", [
    # model's scratch state (and sink's input) lived on worker-b: model restores durable epoch 3
    ("worker-b", {"model": [4, 5], "sink": [4, 5]}),
    # source's scratch outputs lived on worker-a, but clean logged what it made of them
    ("worker-a", {}),
])
def test_losing_one_of_two_workers_reruns_only_what_it_held(lost, rerun) -> None:
    rows = on_workers(history(5, None), {"source": "worker-a", "clean": "worker-a", "model": "worker-b",
                                         "sink": "worker-b"})
    plan = plan_recovery("pipe", GRAPH, rows, [LostWorker(lost)], 5, readable_when(False), REGIMES)
    assert {t.task_id: list(t.rerun) for t in plan.tasks if t.rerun} == rerun
    assert len(plan.rerun_set()) < len(plan.clear_downstream_set())


def windowed_history(epochs: int) -> tuple[TaskGraph, dict, list[LedgerEntry]]:
    """The reference application's left half on worker-a: events (ephemeral) feeds popularity, which
    reads a window of three epochs and logs its output, and rank (lazy, every 3) reads one."""
    regimes = {"events": Ephemeral(), "popularity": Batch(log_outputs=True), "rank": LazyCheckpoint(every=3)}
    graph = TaskGraph(tuple(regimes), (DataEdge("events", "output", "popularity"), DataEdge("events", "output", "rank")))
    rows = []
    for t in range(1, epochs + 1):
        for task, regime in regimes.items():
            tier = regime.output_tier(t).value
            state = regime.state_tier(t).value if regime.keeps_state else None
            back = min(2, t - 1) if task == "popularity" else 0
            rows.append(LedgerEntry(
                dag_id="fig", task_id=task, epoch=t, regime=regime.spec(), run_id=f"run-{t}", try_number=1, notified_through=t, worker="worker-a",
                outputs=(OutputRef("output", f"/{tier}/worker-a/{task}/output" if tier == "scratch"
                                   else f"/durable/{task}/output", tier, t, 10, None),),
                inputs=(InputRef(task_id="events", output="output", through=t, reads_back=back),) if task != "events" else (),
                state_uri=f"/{state}/worker-a/{task}/state" if state == "scratch" else
                (f"/durable/{task}/state" if state else None), state_tier=state))
    return graph, regimes, rows


def test_a_windowed_reader_gets_back_the_lost_epochs_of_a_stateless_producer_it_keeps() -> None:
    graph, regimes, rows = windowed_history(5)
    plan = plan_recovery("fig", graph, rows, [LostWorker("worker-a")], 5, readable_when(False), regimes)
    # rank restores its durable epoch 3 and redoes 4-5, so events re-sends 4-5 and popularity rolls
    # back to 3; popularity's epoch 4 reads events 2-4, whose outputs 2 and 3 were on worker-a's
    # disk: events, which keeps them (no state), redoes them too, so nothing is re-read from the lost disk
    assert {t.task_id: list(t.rerun) for t in plan.tasks if t.rerun} == {
        "events": [2, 3, 4, 5], "popularity": [4, 5], "rank": [4, 5]}
    assert all(not t.rereads for t in plan.tasks)
    # the table lists as kept only what stays as it is: events keeps epoch 1 (its frontier is 3)
    columns = [re.split(r"\s{2,}", line) for line in plan.table().splitlines()[3:6]]
    lines = {c[0]: c[2] for c in columns}
    assert lines == {"events": "1", "popularity": "1-3", "rank": "1-3"}


def test_a_windowed_reader_holds_its_sources_acknowledgement_back_by_its_window() -> None:
    graph, _, rows = windowed_history(5)
    durable = lambda uri, key: uri.startswith("/durable/")  # noqa: E731
    # rank may roll back to its durable epoch 3 and popularity with it; popularity's epoch 4 then
    # reads events 2 and 3 again: the source keeps epoch 2 on, not only epoch 4 on
    assert acknowledged_inputs(rows, durable, graph) == {"events": 1}
    no_window = [dataclasses.replace(r, inputs=tuple(dataclasses.replace(i, reads_back=0) for i in r.inputs))
                 for r in rows]
    assert acknowledged_inputs(no_window, durable, graph) == {"events": 3}


def test_partitions_of_a_group_are_placed_one_by_one_and_follow_their_own_checkpoints() -> None:
    """totals keeps scratch state and leaders reads its scratch outputs one-to-one: partition i of
    both runs where partition i's checkpoint is; partitions without one are spread round-robin;
    a lost worker's partitions move to the live one."""
    from falkirk.policies.placement import partitioned_group

    dag = {"events": (Batch(log_outputs=True), ()), "totals": (LazyCheckpoint(every=4), ("events",)),
           "leaders": (Batch(log_outputs=True), ("totals",))}
    [group] = scratch_groups(dag)
    assert group == {"totals", "leaders"} and partitioned_group(group, {"totals": 4, "leaders": 4})
    assert not partitioned_group(group, {"totals": 4})  # leaders unpartitioned: one home for the group
    workers = ("worker-a", "worker-b")
    fresh = [home_worker("d", group, [], workers, preferred="worker-b", partition=p) for p in range(4)]
    assert fresh == ["worker-b", "worker-a", "worker-b", "worker-a"]
    rows = [dataclasses.replace(row("totals", 3, w, p), map_index=p)
            for p, w in enumerate(["worker-b", "worker-b", "worker-a", "worker-a"])]
    assert [home_worker("d", group, rows, workers, partition=p) for p in range(4)] == [
        "worker-b", "worker-b", "worker-a", "worker-a"]
    lost = {"worker-a": T0 + timedelta(hours=1)}
    assert [home_worker("d", group, rows, workers, lost=lost, partition=p) for p in range(4)] == ["worker-b"] * 4


def _placed_dag(tmp_path, monkeypatch: pytest.MonkeyPatch, dag_file: str):  # noqa: ANN001, ANN202
    """The environment of a scheduler placing over two workers, and a builder of copies of
    ``dags/<dag_file>.py`` as the scheduler reads them (through Airflow's serialization)."""
    import importlib.util
    from pathlib import Path

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("FALKIRK_STORE_URI", str(tmp_path / "store"))
    monkeypatch.setenv("FALKIRK_SCRATCH_URI", str(tmp_path / "scratch"))
    monkeypatch.setenv("FALKIRK_WORKERS", "worker-a,worker-b")
    from airflow.serialization.serialized_objects import DagSerialization

    path = Path(__file__).resolve().parents[2] / "dags" / f"{dag_file}.py"
    spec = importlib.util.spec_from_file_location(f"{dag_file}_placed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda dag_id: DagSerialization.from_dict(DagSerialization.to_dict(module.build_dag(dag_id)))


def test_the_hook_places_partitions_as_airflow_creates_a_runs_task_instances(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Airflow calls the hook twice on a new run's mapped instance (``TaskInstance()``, then
    ``DagRun`` creating the run): the second call keeps the first's worker, partition by partition."""
    from airflow import settings
    from airflow.models.taskinstance import TaskInstance

    dag = _placed_dag(tmp_path, monkeypatch, "falkirk_shards")("shards_placed")
    queues = {}
    for task_id in ("totals", "leaders"):
        for i in range(4):
            ti = TaskInstance(dag.get_task(task_id), dag_version_id=None, run_id="epoch-1", map_index=i)
            settings.task_instance_mutation_hook(ti)  # as DagRun._create_tasks does
            queues[f"{task_id}[{i}]"] = ti.queue
    assert queues == {f"{t}[{i}]": ("worker-a", "worker-b")[i % 2] for t in ("totals", "leaders") for i in range(4)}


def test_a_sink_and_its_concurrent_input_run_on_one_worker_as_the_scheduler_places_them(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``falkirk_sampled``'s ``deliver`` reads ``draw`` while both run, through a marker edge in
    draw's scratch: the scheduler (which reads the serialized DAG) places both on one worker,
    whatever queue the DAG gives them, so the edge is one both reach."""
    from airflow import settings
    from airflow.models.taskinstance import TaskInstance

    from falkirk.plugins.task_metadata import concurrent_inputs_of

    placed = _placed_dag(tmp_path, monkeypatch, "falkirk_sampled")
    for n in range(8):  # DAG ids hash onto either worker: each must keep the two together
        dag = placed(f"sampled_placed_{n}")
        assert concurrent_inputs_of(dag.get_task("deliver")) == ("draw",)
        queues = {}
        for task_id in ("draw", "deliver"):
            ti = TaskInstance(dag.get_task(task_id), dag_version_id=None, run_id="epoch-1")
            settings.task_instance_mutation_hook(ti)
            queues[task_id] = ti.queue
        assert queues["draw"] == queues["deliver"] and queues["draw"] in ("worker-a", "worker-b"), queues


def test_a_sink_placed_after_its_worker_was_recorded_lost_follows_the_producer_that_ran_there(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The soak's lose-worker race: ``draw`` of epoch 19 was placed on worker-b (the group's
    home) just before the recovery of the lost worker-b started, and committed there, its edge
    on worker-b's (fresh) disk. ``deliver`` of epoch 19, placed after, must go to worker-b too:
    elsewhere it finds no edge, delivers from the log, and worker-b's edge keeps the epoch's rows
    for good. draw keeps no scratch table; its commit places the group all the same."""
    from airflow import settings
    from airflow.models.taskinstance import TaskInstance

    from falkirk.policies.planning.recovery_log import RecoveryLog
    from falkirk.policies.store import StoreConfig
    from falkirk.policies.store.ledger import Ledger

    dag = _placed_dag(tmp_path, monkeypatch, "falkirk_sampled")("sampled_lost")
    store = StoreConfig.from_env()
    ledger = Ledger(store)

    def placed(task_id: str) -> str:
        ti = TaskInstance(dag.get_task(task_id), dag_version_id=None, run_id="epoch-19")
        settings.task_instance_mutation_hook(ti)
        return ti.queue

    def committed(task_id: str, epoch: int, regime: str, **scratch: str) -> None:
        ledger.append(LedgerEntry(dag_id="sampled_lost", task_id=task_id, epoch=epoch, regime=regime, run_id=f"epoch-{epoch}", try_number=1, worker="worker-b",
                                  **scratch))

    committed("draw", 18, "batch(log_outputs=true)")
    committed("deliver", 18, "lazy_checkpoint(every=2)", state_tier="scratch",
              state_uri=f"{store.scratch_uri}/worker-b/sampled_lost/deliver/state")
    assert placed("draw") == "worker-b"  # epoch 19's draw: the group's home
    plan = plan_recovery("sampled_lost", TaskGraph(("draw", "deliver"), (DataEdge("draw", "output", "deliver"),)),
                         ledger.entries("sampled_lost"), [LostWorker("worker-b")], 19, readable_when(True),
                         {"draw": Batch(log_outputs=True), "deliver": LazyCheckpoint(every=2)})
    log = RecoveryLog(store)
    log.record(plan)
    log.begin(plan, "test")  # worker-b is recorded lost: deliver's checkpoint there no longer counts
    assert placed("deliver") == "worker-a"  # nothing committed on worker-b since: away from it
    committed("draw", 19, "batch(log_outputs=true)")  # on worker-b, its edge beside it
    assert placed("deliver") == "worker-b"


def test_a_replay_after_both_workers_were_lost_places_a_whole_group_on_one_worker(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recovery naming both workers lost clears task instances whose queues earlier placements
    set apart (events on worker-b, popularity on worker-a): the hook gives every task of
    falkirk_figure1's one scratch group the same worker again, or popularity would look for
    events' scratch output on the wrong disk."""
    from airflow import settings
    from airflow.models.taskinstance import TaskInstance

    from falkirk.policies.planning.recovery_log import RecoveryLog
    from falkirk.policies.store import StoreConfig

    dag = _placed_dag(tmp_path, monkeypatch, "falkirk_figure1")("figure1_placed")
    store = StoreConfig.from_env()
    plan = plan_recovery("figure1_placed", GRAPH, [], [LostWorker("worker-a"), LostWorker("worker-b")], 1,
                         readable_when(False), REGIMES)
    log = RecoveryLog(store)
    log.record(plan)
    log.begin(plan, "test")
    queues = {}
    for n, task_id in enumerate(sorted(dag.task_ids)):
        ti = TaskInstance(dag.get_task(task_id), dag_version_id=None, run_id="epoch-1")
        ti.queue = ("worker-a", "worker-b")[n % 2]  # where an earlier placement sent it
        settings.task_instance_mutation_hook(ti)
        queues[task_id] = ti.queue
    assert set(queues) == {"events", "popularity", "rank", "answers", "stats"}
    assert len(set(queues.values())) == 1 and queues["events"] in ("worker-a", "worker-b"), queues


def test_the_hook_reads_the_ledger_whole_once_then_only_the_commits_made_since(tmp_path) -> None:
    """Airflow calls the hook several times per task instance it creates or clears: the facts it
    places by are read whole once per process, then brought forward from the commits made since
    (the ledger's, the rollbacks' and the recovery log's)."""
    from falkirk.plugins.placement import _FACTS, _placement_facts
    from falkirk.policies.planning.recovery_log import RecoveryLog
    from falkirk.policies.store import StoreConfig
    from falkirk.policies.store.ledger import Ledger

    store = StoreConfig(durable_uri=str(tmp_path / "store"), scratch_uri=str(tmp_path / "scratch"))
    ledger = Ledger(store)
    rows = on_workers(history(2, None), dict.fromkeys(REGIMES, "worker-a"))
    ledger.append(rows[0])
    before = Ledger.reads
    first = _placement_facts(store, rows[0].dag_id)
    assert [e.key for e in first[0]] == [rows[0].key] and first[1] == {}
    assert [_placement_facts(store, rows[0].dag_id) for _ in range(5)] == [first] * 5
    assert Ledger.reads - before == 1  # five more calls, no whole read
    ledger.append(rows[1])
    assert {e.key for e in _placement_facts(store, rows[0].dag_id)[0]} == {r.key for r in rows[:2]}
    snapshot = _FACTS[store.durable_uri, rows[0].dag_id].snapshot
    assert Ledger.reads - before == 1 and snapshot.scans == 2 and snapshot.refreshes == 6  # the new row alone
    # a rollback is seen at the next call
    ledger.invalidations.record([rows[1]], "plan-0")
    assert [e.key for e in _placement_facts(store, rows[0].dag_id)[0]] == [rows[0].key]
    # a recovery of the lost worker-a is seen at the next call, once it has started
    plan = plan_recovery(rows[0].dag_id, GRAPH, rows[:2], [LostWorker("worker-a")], 1, readable_when(False),
                         REGIMES)
    log = RecoveryLog(store)
    log.record(plan)
    assert _placement_facts(store, rows[0].dag_id)[1] == {}
    log.begin(plan, "test")
    assert list(_placement_facts(store, rows[0].dag_id)[1]) == ["worker-a"] and Ledger.reads - before == 1


def test_the_hook_places_by_the_facts_read_last_while_the_store_does_not_answer(tmp_path) -> None:
    """A store that cannot be read (here a damaged commit of the ledger's log) must not leave a
    task instance on the DAG's queue, where any worker takes it away from its group's scratch
    data (the soak met a group split so, for good, during an S3 outage): the hook places it by
    the facts it read last, both when it brings them forward and when it reads them whole."""
    from pathlib import Path

    from falkirk.plugins.placement import _FACTS, _placement_facts
    from falkirk.policies.store import StoreConfig
    from falkirk.policies.store.ledger import Ledger

    store = StoreConfig(durable_uri=str(tmp_path / "store"), scratch_uri=str(tmp_path / "scratch"))
    ledger = Ledger(store)
    rows = on_workers(history(2, None), dict.fromkeys(REGIMES, "worker-a"))
    ledger.append(rows[0])
    first = _placement_facts(store, rows[0].dag_id)
    assert [e.worker for e in first[0]] == ["worker-a"]
    log = Path(ledger.uri) / "_delta_log"
    damaged = log / f"{len(list(log.glob('*.json'))):020d}.json"
    damaged.write_text("{not a commit")  # the next version of the ledger: unreadable
    assert _placement_facts(store, rows[0].dag_id) == first
    _FACTS[store.durable_uri, rows[0].dag_id].made -= 10 ** 6  # due to be read whole again
    assert _placement_facts(store, rows[0].dag_id) == first
    damaged.unlink()


@pytest.mark.parametrize("module", ["placement", "pairs", "sender_logs", "dags_test", "operators"])
def test_each_policy_hook_is_registered_whichever_module_is_imported_before_airflow(module: str) -> None:
    """The policy modules are Airflow entry points: importing one first loads Airflow, which loads
    them all; none may be registered half-made, without its hooks."""
    import subprocess
    import sys

    code = (f"import falkirk.plugins.{module}\n"
            "import airflow.settings as s\n"
            "pm = s.get_policy_plugin_manager()\n"
            "print(sorted((n, len(pm.get_hookcallers(p) or [])) for n, p in pm.list_name_plugin()"
            " if n.startswith('falkirk')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == ("[('falkirk', 2), ('falkirk_dags_test', 1), ('falkirk_pairs', 1), "
                                                    "('falkirk_sender_logs', 1)]"), done.stderr[-2000:]
