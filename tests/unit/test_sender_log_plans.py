"""Recovery plans that mix sender-side logs with the four Falkirk regimes, against a brute force.

Random chains of three or four tasks: a source (Ephemeral or logged Batch), then tasks drawn
from every regime, SenderLog with ``immediate``, ``window(2)`` and ``at_end`` (ending at a
random epoch) among them. A SenderLog task keeps its state in scratch only; to the planner its
epoch ``t`` is a checkpoint while that copy is readable, or while every block it has not
released by ``t`` is (its next epoch rebuilds the state from them). Histories: epochs run, a
failed task instance, a lost scratch tier, a bad epoch, and blocks garbage collection took.

The oracle does not use the solver or Ξ: it enumerates every assignment of "epochs kept" per
task, keeps those that are consistent in plain terms (a task keeps no epoch its producer
redoes, and reads every epoch it redoes either from its producer's log or from the producer's
re-run), and takes the greatest.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings, strategies as st

from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, LazyCheckpoint, SenderLog
from falkirk.policies.planning.chains import DataEdge, TaskGraph
from falkirk.policies.planning.recovery import BadEpoch, FailedTask, LostScratch, plan_recovery
from falkirk.policies.regimes import Regime
from falkirk.policies.store.commits import CommitKey
from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef

SOURCES = [Ephemeral(), Batch(log_outputs=True)]


def middle(upstream: str, end: int) -> list[Regime]:
    return [Ephemeral(), Batch(log_outputs=True), LazyCheckpoint(every=2), EagerCheckpoint(),
            SenderLog(release={upstream: "immediate"}), SenderLog(release={upstream: "window(2)"}),
            SenderLog(release={upstream: "at_end"}, end=end)]


def history(tasks: list[str], regimes: dict[str, Regime], epochs: int,
            failed: tuple[str, int] | None) -> list[LedgerEntry]:
    """Ledger rows of ``epochs`` runs of the chain; a failed instance leaves no row for itself,
    what reads it in that run, or the later epochs of a stateful task."""
    rows, missing = [], set()
    for t in range(1, epochs + 1):
        for i, task in enumerate(tasks):
            regime, up = regimes[task], tasks[i - 1] if i else None
            if (task, t) == failed or (up and (up, t) in missing) or (regime.keeps_state and (task, t - 1) in missing):
                missing.add((task, t))
                continue
            tier = regime.output_tier(t).value
            state_tier = regime.state_tier(t).value if regime.keeps_state else None
            rows.append(LedgerEntry(
                dag_id="pipe", task_id=task, epoch=t, regime=regime.spec(), run_id=f"run-{t}", try_number=1,
                outputs=(OutputRef("output", f"/{tier}/{task}/output", tier, t, 10, None),),
                inputs=(InputRef(task_id=up, output="output", through=t),) if up else (), notified_through=t,
                state_uri=f"/{state_tier}/{task}/state" if state_tier else None, state_tier=state_tier,
                state_version=t))
    return rows


def oracle(tasks, regimes, rows, epochs, bad, scratch_lost, pruned) -> dict[str, int]:
    """The greatest consistent 'last epoch kept' per task, by enumeration."""
    untrusted = set()
    if bad:
        task, at = bad
        untrusted = {(task, e) for e in range(at, epochs + 1 if regimes[task].keeps_state else at + 1)}
    have = {(r.task_id, r.epoch) for r in rows} - untrusted

    def output_readable(task: str, e: int) -> bool:
        tier = regimes[task].output_tier(e).value
        return ((task, e) in have and not (scratch_lost and tier == "scratch")
                and (task, e) not in pruned)

    def restorable(i: int, f: int) -> bool:
        task, regime = tasks[i], regimes[tasks[i]]
        if f == 0:
            return True
        if any((task, e) not in have for e in range(1, f + 1)):
            return False
        if not regime.keeps_state or not (scratch_lost and regime.state_tier(f).value == "scratch"):
            return True
        if isinstance(regime, SenderLog):  # rebuilt from the blocks not released by f
            up = tasks[i - 1]
            released = regime.released(f)[up]
            return all(output_readable(up, e) for e in range(released + 1, f + 1))
        return False

    best = None
    for assignment in itertools.product(range(epochs + 1), repeat=len(tasks)):
        f = dict(zip(tasks, assignment))
        if not all(restorable(i, f[t]) for i, t in enumerate(tasks)):
            continue
        if all(f[dst] <= f[src] and all(output_readable(src, e) for e in range(f[dst] + 1, f[src] + 1))
               for src, dst in zip(tasks, tasks[1:])):
            best = f if best is None else {t: max(best[t], f[t]) for t in tasks}
    return best


@settings(max_examples=400, deadline=None)
@given(data=st.data(), length=st.integers(3, 4), epochs=st.integers(3, 6),
       kind=st.sampled_from(["failed", "lost", "bad", "failed+lost"]), at=st.integers(1, 6), end=st.integers(0, 6))
def test_plans_mixing_sender_logs_with_checkpoints_keep_the_greatest_consistent_frontier(
        data, length: int, epochs: int, kind: str, at: int, end: int) -> None:
    tasks = [f"t{i}" for i in range(length)]
    regimes: dict[str, Regime] = {tasks[0]: data.draw(st.sampled_from(SOURCES))}
    for i, task in enumerate(tasks[1:], start=1):
        regimes[task] = data.draw(st.sampled_from(middle(tasks[i - 1], end)))
    graph = TaskGraph(tuple(tasks), tuple(DataEdge(a, "output", b) for a, b in zip(tasks, tasks[1:])))
    task = data.draw(st.sampled_from(tasks))
    at = min(at, epochs)
    failed = (task, at) if "failed" in kind else None
    rows = history(tasks, regimes, epochs, failed)
    # garbage collection took some logged blocks (as a mis-declared release would let it)
    logged = sorted((r.task_id, r.epoch) for r in rows if r.outputs[0].tier == "durable")
    pruned = set(data.draw(st.lists(st.sampled_from(logged), max_size=3, unique=True))) if logged else set()

    def readable(uri: str, key: CommitKey) -> bool:
        if "lost" in kind and uri.startswith("/scratch/"):
            return False
        return not (uri.endswith("/output") and (key.task_id, key.epoch) in pruned)

    failures = []
    if failed:
        failures.append(FailedTask(task, at))
    if "lost" in kind:
        failures.append(LostScratch("/scratch"))
    if kind == "bad":
        failures.append(BadEpoch(task, at))
    plan = plan_recovery("pipe", graph, rows, failures, last_epoch=epochs, readable=readable, regimes=regimes)
    expected = oracle(tasks, regimes, rows, epochs, (task, at) if kind == "bad" else None, "lost" in kind, pruned)
    assert {t.task_id: t.kept_through for t in plan.tasks} == expected, {t: r.spec() for t, r in regimes.items()}


def test_an_at_end_aggregator_whose_scratch_is_lost_keeps_its_epochs_while_its_input_is_retained() -> None:
    """S2 in plan form: total (at_end over epochs 1-10) lost its scratch after epoch 7. Its epochs
    stand (the next one rebuilds the state from ingest's epochs 1-7). With ingest's epoch 3
    pruned, only epochs 1-2 can be rebuilt: total keeps them and redoes 3-7 (its epoch 3
    rebuilds from ingest's 1-2), and ingest redoes epoch 3 for it."""
    regimes = {"ingest": Batch(log_outputs=True), "total": SenderLog(release={"ingest": "at_end"}, end=10)}
    tasks = list(regimes)
    graph = TaskGraph(tuple(tasks), (DataEdge("ingest", "output", "total"),))
    rows = history(tasks, regimes, 7, None)
    kept = plan_recovery("pipe", graph, rows, [LostScratch("/scratch")], 7,
                         lambda uri, key: not uri.startswith("/scratch/"), regimes)
    assert {t.task_id: (t.kept_through, t.rerun) for t in kept.tasks} == {"ingest": (7, ()), "total": (7, ())}
    pruned = plan_recovery("pipe", graph, rows, [LostScratch("/scratch")], 7,
                           lambda uri, key: not uri.startswith("/scratch/") and
                           (key.task_id, key.epoch) != ("ingest", 3), regimes)
    assert {t.task_id: (t.kept_through, t.rerun) for t in pruned.tasks} == {
        "ingest": (2, (3,)), "total": (2, (3, 4, 5, 6, 7))}
