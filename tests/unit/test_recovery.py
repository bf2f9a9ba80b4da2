"""Recovery plans against an independent brute force, on a four-regime pipeline.

The pipeline: source (Ephemeral, outputs in scratch) → clean (Batch, logs) → model
(LazyCheckpoint every=3, outputs in scratch) → sink (EagerCheckpoint). Ledgers are
generated for random histories: epochs run, a failed task instance, a lost scratch
tier, a bad epoch. The oracle does not use the solver or Ξ: it enumerates every
assignment of "epochs kept" per task and keeps those that are consistent in plain
Airflow terms, then takes the greatest.
"""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings, strategies as st

from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, LazyCheckpoint
from falkirk.policies.planning.chains import DataEdge, TaskGraph
from falkirk.policies.planning.recovery import BadEpoch, FailedTask, LostScratch, PlanError, RecoveryPlan, plan_recovery
from falkirk.policies.store.commits import CommitKey
from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef

REGIMES = {"source": Ephemeral(), "clean": Batch(log_outputs=True), "model": LazyCheckpoint(every=3),
           "sink": EagerCheckpoint()}
TASKS = tuple(REGIMES)
GRAPH = TaskGraph(TASKS, tuple(DataEdge(a, "output", b) for a, b in zip(TASKS, TASKS[1:])))
UPSTREAM = {b: a for a, b in zip(TASKS, TASKS[1:])}


def history(epochs: int, failed: tuple[str, int] | None) -> list[LedgerEntry]:
    """Ledger rows of ``epochs`` DAG runs, as Airflow leaves them after a failed (task, epoch).

    The failed instance has no row, nor has anything downstream of it in that run
    (upstream_failed); a stateful task does not run past a missing epoch of its own
    (depends_on_past), while a stateless one runs every epoch whose input exists.
    """
    rows = []
    missing: set[tuple[str, int]] = set()
    for t in range(1, epochs + 1):
        for task, regime in REGIMES.items():
            up = UPSTREAM.get(task)
            if ((task, t) == failed or (up and (up, t) in missing)
                    or (regime.keeps_state and (task, t - 1) in missing)):
                missing.add((task, t))
                continue
            tier = regime.output_tier(t).value
            out = OutputRef("output", f"/{tier}/{task}/output", tier, t, 10, None)
            state_uri = state_tier = None
            if regime.keeps_state:
                state_tier = regime.state_tier(t).value
                state_uri = f"/{state_tier}/{task}/state"
            rows.append(LedgerEntry(dag_id="pipe", task_id=task, epoch=t, regime=regime.spec(), run_id=f"run-{t}", try_number=1, outputs=(out,),
                                    inputs=(InputRef(task_id=up, output="output", through=t),) if up else (), notified_through=t,
                                    state_uri=state_uri, state_tier=state_tier, state_version=t))
    return rows


def readable_when(scratch_lost: bool):
    def readable(uri: str, key: CommitKey) -> bool:
        return not (scratch_lost and uri.startswith("/scratch/"))
    return readable


def oracle(rows: list[LedgerEntry], epochs: int, bad: tuple[str, int] | None, scratch_lost: bool,
           ) -> tuple[dict[str, int], set[tuple[str, int]]]:
    """The greatest consistent 'last epoch kept' per task, by enumeration, and the instances to re-run."""
    untrusted = set()
    if bad:
        task, at = bad
        untrusted = {(task, e) for e in range(at, epochs + 1 if REGIMES[task].keeps_state else at + 1)}
    have = {(r.task_id, r.epoch) for r in rows} - untrusted

    def restorable(task: str, f: int) -> bool:
        if f == 0:
            return True
        if any((task, e) not in have for e in range(1, f + 1)):
            return False
        regime = REGIMES[task]
        if not regime.keeps_state:
            return True
        return not (scratch_lost and regime.state_tier(f).value == "scratch")

    def output_readable(task: str, e: int) -> bool:
        return (task, e) in have and not (scratch_lost and REGIMES[task].output_tier(e).value == "scratch")

    best = None
    for assignment in itertools.product(range(epochs + 1), repeat=len(TASKS)):
        f = dict(zip(TASKS, assignment))
        if not all(restorable(t, f[t]) for t in TASKS):
            continue
        ok = True
        for src, dst in zip(TASKS, TASKS[1:]):
            # dst cannot keep epochs whose input src will redo; and src must still hold, in a
            # readable log, every epoch dst redoes that src keeps.
            if f[dst] > f[src] or not all(output_readable(src, e) for e in range(f[dst] + 1, f[src] + 1)):
                ok = False
        if ok:
            best = f if best is None else {t: max(best[t], f[t]) for t in TASKS}

    # Re-runs, epoch by epoch along the chain: a stateful task redoes everything past its
    # frontier; a stateless one an epoch it lacks, whose input is redone, or whose output a
    # redone consumer cannot read (walking back up the chain for the last).
    redo: set[tuple[str, int]] = set()
    for e in range(1, epochs + 1):
        for i, task in enumerate(TASKS):
            if e <= best[task]:
                continue
            up = TASKS[i - 1] if i else None
            if REGIMES[task].keeps_state or (task, e) not in have or (up and (up, e) in redo):
                redo.add((task, e))
        for i in range(len(TASKS) - 1, 0, -1):
            src, dst = TASKS[i - 1], TASKS[i]
            if (dst, e) in redo and e > best[src] and not output_readable(src, e) and (src, e) not in redo:
                redo.add((src, e))
                for later in TASKS[i:]:  # its consumers' input changes too
                    if e > best[later]:
                        redo.add((later, e))
    return best, redo


@settings(max_examples=300, deadline=None)
@given(epochs=st.integers(3, 6), kind=st.sampled_from(["failed", "lost", "bad", "failed+lost"]),
       task=st.sampled_from(TASKS), at=st.integers(1, 6))
def test_plan_rerun_set_is_the_minimal_one(epochs: int, kind: str, task: str, at: int) -> None:
    at = min(at, epochs)
    failed = (task, at) if "failed" in kind else None
    rows = history(epochs, failed)
    failures = []
    if failed:
        failures.append(FailedTask(task, at))
    if "lost" in kind:
        failures.append(LostScratch("/scratch"))
    if kind == "bad":
        failures.append(BadEpoch(task, at))
    plan = plan_recovery("pipe", GRAPH, rows, failures, last_epoch=epochs, readable=readable_when(False),
                         regimes=REGIMES)
    frontiers, redo = oracle(rows, epochs, (task, at) if kind == "bad" else None, scratch_lost="lost" in kind)
    assert {t.task_id: t.kept_through for t in plan.tasks} == frontiers
    assert plan.rerun_set() == redo


@pytest.mark.parametrize("failure, epochs, rerun, cleared", [
    # (a) model fails at epoch 4 of 6: model restores its durable epoch 3 and redoes 4-6
    # (clean's log feeds it); sink redoes 4-6. Clear-downstream touches the same instances
    # here, but does not restore model's state.
    (FailedTask("model", 4), 6, {"model": [4, 5, 6], "sink": [4, 5, 6]}, 6),
    # (a) clean fails at epoch 4 of 6: clean redoes 4 only (its epochs 5 and 6 stand);
    # model restores epoch 3 and, like sink, redoes 4-6. Clear-downstream redoes clean 4-6 too.
    (FailedTask("clean", 4), 6, {"clean": [4], "model": [4, 5, 6], "sink": [4, 5, 6]}, 9),
    # (b) the scratch tier is lost after epoch 5: model's newest durable state is epoch 3;
    # source's outputs are gone too, but clean keeps its log, so source and clean stay.
    # Clearing every task that had data there, from its first lost epoch: everything.
    (LostScratch("/scratch"), 5, {"model": [4, 5], "sink": [4, 5]}, 20),
    # (c) source's epoch 4 was bad: source and clean redo epoch 4 only; the stateful tasks
    # restore epoch 3 and redo 4-6. Clear-downstream redoes every task from epoch 4.
    (BadEpoch("source", 4), 6, {"source": [4], "clean": [4], "model": [4, 5, 6], "sink": [4, 5, 6]}, 12),
])
def test_plans_for_each_failure_input(failure, epochs, rerun, cleared) -> None:
    failed = (failure.task_id, failure.epoch) if isinstance(failure, FailedTask) else None
    rows = history(epochs, failed)
    plan = plan_recovery("pipe", GRAPH, rows, [failure], last_epoch=epochs, readable=readable_when(False),
                         regimes=REGIMES)
    print(f"{failure.describe()}: re-runs {len(plan.rerun_set())}, clear-downstream {len(plan.clear_downstream_set())}")
    assert {t.task_id: list(t.rerun) for t in plan.tasks if t.rerun} == rerun
    assert plan.task("model").restore_from.epoch == 3 and plan.task("model").restore_from.tier == "durable"
    assert len(plan.clear_downstream_set()) == cleared
    # Deterministic and serialisable: the JSON round-trips to the same plan and id.
    again = RecoveryPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan and again.plan_id == plan.plan_id
    assert plan.plan_id in plan.table() and "clear-downstream" in plan.table()


def test_bad_requests_name_the_field() -> None:
    rows = history(3, None)
    with pytest.raises(PlanError, match=r"failures\[0\].task_id: unknown task 'nope'"):
        plan_recovery("pipe", GRAPH, rows, [FailedTask("nope", 2)], 3, readable_when(False), REGIMES)
    with pytest.raises(PlanError, match=r"failures\[0\].epoch: 9 is not an epoch that has run; choose one of 1..3"):
        plan_recovery("pipe", GRAPH, rows, [BadEpoch("clean", 9)], 3, readable_when(False), REGIMES)
    with pytest.raises(PlanError, match="failures: name at least one"):
        plan_recovery("pipe", GRAPH, rows, [], 3, readable_when(False), REGIMES)
    plan = plan_recovery("pipe", GRAPH, rows, [BadEpoch("clean", 2)], 3, readable_when(False), REGIMES)
    edited = {**plan.to_json(), "last_epoch": 2}
    with pytest.raises(PlanError, match="plan_id .* does not match the plan's content"):
        RecoveryPlan.from_json(edited)


@pytest.mark.parametrize("window, rerun_window, rereads", [
    # each epoch of `window` reads source's epochs e-2..e: a redone source epoch 3 changes
    # window's epochs 3, 4 and 5 (6 reads 4-6), which read source's kept epochs 1, 2, 4, 5
    (3, [3, 4, 5], (1, 2, 4, 5)),
    (1, [3], ()),  # reading only its own epoch, window redoes epoch 3 alone
])
def test_a_windowed_reader_reruns_every_epoch_whose_window_holds_a_redone_epoch(
        window: int, rerun_window: list[int], rereads: tuple[int, ...]) -> None:
    regimes = {"source": Batch(log_outputs=True), "window": Batch(log_outputs=True), "report": Ephemeral()}
    graph = TaskGraph(tuple(regimes), (DataEdge("source", "output", "window"), DataEdge("window", "output", "report")))
    back = {"source": (), "window": ("source", window - 1), "report": ("window", 0)}
    rows = [LedgerEntry(dag_id="pipe", task_id=task, epoch=t, regime=regimes[task].spec(), run_id=f"run-{t}", try_number=1, notified_through=t,
                        outputs=(OutputRef("output", f"/durable/{task}/output", "durable", t, 10, None),),
                        inputs=(InputRef(task_id=back[task][0], output="output", through=t, reads_back=min(back[task][1], t - 1)),) if back[task] else ())
            for t in range(1, 7) for task in regimes]
    plan = plan_recovery("pipe", graph, rows, [BadEpoch("source", 3)], last_epoch=6, readable=readable_when(False),
                         regimes=regimes)
    assert {t.task_id: list(t.rerun) for t in plan.tasks if t.rerun} == {
        "source": [3], "window": rerun_window, "report": rerun_window}
    reread = {(src, e) for src, _, epochs in plan.task("window").rereads for e in epochs}
    assert reread == {("source", e) for e in rereads}
