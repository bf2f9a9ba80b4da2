"""Recovery plans for partitioned pipelines against an independent brute force.

Random pipelines of two or three tasks, each unpartitioned or split into two partitions,
under random regimes, joined by one-to-one, broadcast or repartitioning edges whose
readers may read a window of past epochs. Ledgers come from random histories run as
Airflow runs them (a task's instances wait for every instance of its upstream tasks; a
stateful partition waits for its own previous epoch), with one failure among: a failed
partition, a bad epoch of one partition or of a whole task, a lost scratch tier, a lost
worker holding some of the partitions.

The oracle knows neither the solver nor Ξ. It enumerates every assignment of "last epoch
kept" per processor (task or partition), keeps those consistent in plain terms, and takes
the greatest:

* a reader keeps no epoch its producer will redo (``kept[dst] <= kept[src]`` per edge), and
  a producer keeps past its reader's frontier only epochs its reader can still read;
* a redone epoch of a reader reads its window of the producer's epochs again: each must
  be readable, or be redone by the producer. A stateless producer can redo any epoch (its
  epochs are independent); a stateful one cannot produce again an epoch it keeps, so an
  assignment that needs that is not consistent;
* a producer's redone epoch changes the input of every reader epoch whose window holds it.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings, strategies as st

from falkirk.policies.ids import ProcessorId
from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, LazyCheckpoint, Regime
from falkirk.policies.partitions import Broadcast, OneToOne, PartitionError, Repartition, Routing, processor_edges, processors
from falkirk.policies.planning.chains import DataEdge, TaskGraph
from falkirk.policies.planning.recovery import (BadEpoch, FailedTask, LostScratch, LostWorker, plan_recovery)
from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef

REGIMES = [Ephemeral(), Batch(log_outputs=True), LazyCheckpoint(every=2), EagerCheckpoint()]


@dataclass(frozen=True)
class Pipeline:
    """Tasks in topological order, their regimes and partition counts, and task-level edges."""

    tasks: tuple[str, ...]
    regimes: dict[str, Regime]
    partitions: dict[str, int | None]
    edges: tuple[tuple[str, str, Routing, int], ...]  # (producer, consumer, routing, window back)
    workers: dict[str, str]  # processor -> the worker it commits on

    def procs(self, task: str) -> tuple[str, ...]:
        return processors(task, self.partitions[task])

    @property
    def all_procs(self) -> tuple[str, ...]:
        return tuple(p for t in self.tasks for p in self.procs(t))

    def proc_edges(self) -> list[tuple[str, str, int]]:
        return [(s, d, back) for src, dst, routing, back in self.edges
                for s, d in processor_edges(src, dst, routing, self.partitions)]

    def regime(self, proc: str) -> Regime:
        return self.regimes[ProcessorId.parse(proc).task]

    def graph(self) -> TaskGraph:
        return TaskGraph(self.all_procs, tuple(DataEdge(s, "output", d) for s, d, _ in self.proc_edges()))


@st.composite
def pipelines(draw) -> Pipeline:
    n = draw(st.integers(2, 3))
    tasks = ("a", "b", "c")[:n]
    partitions: dict[str, int | None] = {}
    for t in tasks:  # at most five processors, so that the brute force stays small
        room = 5 - sum(p or 1 for p in partitions.values()) - (n - len(partitions) - 1)
        partitions[t] = draw(st.sampled_from([None, 2] if room >= 2 else [None]))
    regimes = {t: draw(st.sampled_from(REGIMES)) for t in tasks}
    pairs = list(zip(tasks, tasks[1:])) + ([("a", "c")] if n == 3 and draw(st.booleans()) else [])
    edges = []
    for src, dst in pairs:
        kinds: list[Routing] = [Broadcast(), Repartition("key")]
        if partitions[src] == partitions[dst] and partitions[src]:
            kinds.append(OneToOne())
        edges.append((src, dst, draw(st.sampled_from(kinds)), draw(st.integers(0, 2))))
    pipe = Pipeline(tasks, regimes, partitions, tuple(edges), {})
    workers = {p: draw(st.sampled_from(["w0", "w1"])) for p in pipe.all_procs}
    return Pipeline(tasks, regimes, partitions, tuple(edges), workers)


def history(pipe: Pipeline, epochs: int, failed: str | None, at: int) -> list[LedgerEntry]:
    """The ledger after ``epochs`` DAG runs in which ``failed`` (a processor) failed at epoch ``at``.

    An instance is missing when it failed, when any instance of an upstream task is missing
    in its run (Airflow's dependencies are between tasks), when it keeps state and an instance
    of its task is missing in the previous run (Airflow's ``depends_on_past`` counts every map
    index of the task), or when its window reaches a missing epoch of what it reads.
    """
    missing: set[tuple[str, int]] = set()
    rows = []
    reads = pipe.proc_edges()
    for t in range(1, epochs + 1):
        for task in pipe.tasks:
            upstream = [p for s, d, *_ in pipe.edges if d == task for p in pipe.procs(s)]
            for proc in pipe.procs(task):
                regime = pipe.regime(proc)
                sources = [(s, back) for s, d, back in reads if d == proc]
                if ((proc, t) == (failed, at) or any((u, t) in missing for u in upstream)
                        or (regime.keeps_state and any((q, t - 1) in missing for q in pipe.procs(task)))
                        or any((s, x) in missing for s, back in sources for x in range(max(t - back, 1), t + 1))):
                    missing.add((proc, t))
                    continue
                task_id, index = ProcessorId.parse(proc).task, ProcessorId.parse(proc).map_index
                tier = regime.output_tier(t).value
                state_uri = state_tier = None
                if regime.keeps_state:
                    state_tier = regime.state_tier(t).value
                    state_uri = f"/{state_tier}/{task_id}/{index}/state"
                inputs = tuple(InputRef(task_id=ProcessorId.parse(s).task, output="output", through=t, reads_back=min(back, t - 1),
                                        map_index=ProcessorId.parse(s).map_index) for s, back in sources)
                rows.append(LedgerEntry(
                    dag_id="pipe", task_id=task_id, epoch=t, regime=regime.spec(), run_id=f"run-{t}", try_number=1, map_index=index, notified_through=t,
                    outputs=(OutputRef("output", f"/{tier}/{task_id}/{index}/output", tier, t, 10),),
                    inputs=inputs, state_uri=state_uri, state_tier=state_tier, state_version=t,
                    worker=pipe.workers[proc]))
    return rows


def oracle(pipe: Pipeline, rows: list[LedgerEntry], epochs: int, untrusted: set[tuple[str, int]],
           lost: set[str]) -> tuple[dict[str, int], set[tuple[str, int]]]:
    """The greatest consistent 'last epoch kept' per processor, by enumeration, and what re-runs.

    ``lost`` are the processors whose scratch tables are gone.
    """
    have = {(r.processor, r.epoch) for r in rows} - untrusted
    procs = pipe.all_procs
    # A window is known from what the ledger records: the widest read of any epoch so far (epoch 1
    # of a window of three reads one epoch, so a ledger of that epoch alone knows no window).
    seen = {(i.processor, r.processor): 0 for r in rows for i in r.inputs}
    for r in rows:
        for i in r.inputs:
            seen[i.processor, r.processor] = max(seen[i.processor, r.processor], i.reads_back)
    edges = [(src, dst, seen.get((src, dst), 0)) for src, dst, _ in pipe.proc_edges()]

    def scratch_gone(proc: str, tier: str) -> bool:
        return proc in lost and tier == "scratch"

    def output_readable(proc: str, e: int) -> bool:
        return (proc, e) in have and not scratch_gone(proc, pipe.regime(proc).output_tier(e).value)

    def restorable(proc: str, f: int) -> bool:
        if f == 0:
            return True
        if any((proc, e) not in have for e in range(1, f + 1)):
            return False
        regime = pipe.regime(proc)
        return not (regime.keeps_state and scratch_gone(proc, regime.state_tier(f).value))

    def redone(f: dict[str, int]) -> set[tuple[str, int]] | None:
        """What re-runs under the frontiers ``f``, or None if they are not consistent."""
        redo = {(p, e) for p in procs for e in range(f[p] + 1, epochs + 1)
                if pipe.regime(p).keeps_state or (p, e) not in have}
        while True:
            grown = set()
            for src, dst, back in edges:
                for p, y in redo:
                    if p == src:  # the reader's input changes in every window holding y
                        grown |= {(dst, x) for x in range(y, min(y + back, epochs) + 1) if x > f[dst]}
                    if p == dst:  # the reader reads its window again
                        for x in range(max(y - back, 1), y + 1):
                            if (src, x) in redo or output_readable(src, x):
                                continue
                            if pipe.regime(src).keeps_state:
                                return None
                            grown.add((src, x))
            if grown <= redo:
                return redo
            redo |= grown

    choices = [[f for f in range(epochs + 1) if restorable(p, f)] for p in procs]
    best: dict[str, int] | None = None
    for assignment in itertools.product(*choices):
        f = dict(zip(procs, assignment))
        if any(f[dst] > f[src] or not all(output_readable(src, y) for y in range(f[dst] + 1, f[src] + 1))
               for src, dst, _ in edges) or redone(f) is None:
            continue
        best = f if best is None else {p: max(best[p], f[p]) for p in procs}
    assert best is not None  # keeping nothing is always consistent
    redo = redone(best)
    assert redo is not None, f"the greatest assignment {best} is not consistent itself"
    return best, redo


FAILURES = ["failed", "bad", "bad-task", "lost", "worker", "failed+worker"]


@settings(max_examples=300, deadline=None)
@given(pipe=pipelines(), epochs=st.integers(3, 4), kind=st.sampled_from(FAILURES), which=st.integers(0, 10),
       at=st.integers(1, 4))
def test_partition_plans_equal_the_brute_force(pipe: Pipeline, epochs: int, kind: str, which: int, at: int) -> None:
    at = min(at, epochs)
    proc = pipe.all_procs[which % len(pipe.all_procs)]
    failed = proc if "failed" in kind else None
    rows = history(pipe, epochs, failed, at)
    failures: list = []
    untrusted: set[tuple[str, int]] = set()
    named = [proc] if kind != "bad-task" else list(pipe.procs(ProcessorId.parse(proc).task))
    if failed:
        failures.append(FailedTask(proc, at))
    if kind.startswith("bad"):
        failures.append(BadEpoch(proc if kind == "bad" else ProcessorId.parse(proc).task, at))
    if failed or kind.startswith("bad"):
        for p in named:
            untrusted |= {(p, e) for e in range(at, (epochs if pipe.regime(p).keeps_state else at) + 1)}
    lost: set[str] = set()
    if kind == "lost":
        failures.append(LostScratch("/scratch"))
        lost = set(pipe.all_procs)
    if "worker" in kind:
        failures.append(LostWorker("w0"))
        lost = {p for p in pipe.all_procs if pipe.workers[p] == "w0"}
    plan = plan_recovery("pipe", pipe.graph(), rows, failures, last_epoch=epochs, readable=lambda uri, key: True,
                         regimes={t: pipe.regimes[t] for t in pipe.tasks})
    frontiers, redo = oracle(pipe, rows, epochs, untrusted, lost)
    assert {t.task_id: t.kept_through for t in plan.tasks} == frontiers
    assert plan.rerun_set() == redo


def reference_rows(epochs: int, failed: tuple[str, int] | None = None) -> tuple[Pipeline, list[LedgerEntry]]:
    """events (4 partitions, logged) -> repartition -> tally (4 partitions, stateful) -> report."""
    pipe = Pipeline(("events", "tally", "report"),
                    {"events": Batch(log_outputs=True), "tally": LazyCheckpoint(every=2), "report": EagerCheckpoint()},
                    {"events": 4, "tally": 4, "report": None},
                    (("events", "tally", Repartition("user"), 0), ("tally", "report", Broadcast(), 0)),
                    {p: ("worker-a" if p in ("tally[0]", "tally[1]") else "worker-b")
                     for p in processors("events", 4) + processors("tally", 4) + ("report",)})
    return pipe, history(pipe, epochs, *(failed or (None, 0)))


def test_one_failed_partition_reruns_that_partition_and_what_reads_it() -> None:
    pipe, rows = reference_rows(6, failed=("tally[2]", 4))
    plan = plan_recovery("pipe", pipe.graph(), rows, [FailedTask("tally[2]", 4)], last_epoch=6,
                         readable=lambda uri, key: True, regimes=pipe.regimes)
    # the other partitions keep epoch 4; they run 5 and 6, which Airflow held back (depends_on_past
    # waits for every map index of the previous run)
    assert {t.task_id: list(t.rerun) for t in plan.tasks if t.rerun} == {
        "tally[0]": [5, 6], "tally[1]": [5, 6], "tally[2]": [4, 5, 6], "tally[3]": [5, 6], "report": [4, 5, 6]}
    assert plan.task("tally[2]").restore_from.epoch == 3 and plan.task("tally[0]").restore_from.epoch == 4
    # Airflow's clear of the failed mapped instance, downstream and future: that partition, and report
    assert len(plan.clear_downstream_set()) == 6
    # a plan that saw tally as one processor would redo epoch 4 of all four partitions too
    whole = plan_recovery("pipe", pipe.graph(), rows, [FailedTask("tally", 4)], last_epoch=6,
                          readable=lambda uri, key: True, regimes=pipe.regimes)
    assert len(whole.rerun_set()) == 15 and len(plan.rerun_set()) == 12


def test_a_lost_worker_reruns_its_partitions_from_their_durable_checkpoints() -> None:
    pipe, rows = reference_rows(5)  # tally[0] and tally[1] kept epochs 1, 3, 5 in scratch on worker-a
    plan = plan_recovery("pipe", pipe.graph(), rows, [LostWorker("worker-a")], last_epoch=5,
                         readable=lambda uri, key: True, regimes=pipe.regimes)
    assert {t.task_id: list(t.rerun) for t in plan.tasks if t.rerun} == {
        "tally[0]": [5], "tally[1]": [5], "report": [5]}
    assert plan.task("tally[0]").restore_from.epoch == 4 and plan.task("tally[0]").restore_from.tier == "durable"
    # Airflow would clear both partitions from epoch 1 (their first scratch table), with report
    assert len(plan.clear_downstream_set()) == 15


def test_a_bad_epoch_of_one_source_partition_reaches_every_reader_of_it() -> None:
    pipe, rows = reference_rows(6)
    plan = plan_recovery("pipe", pipe.graph(), rows, [BadEpoch("events[1]", 3)], last_epoch=6,
                         readable=lambda uri, key: True, regimes=pipe.regimes)
    rerun = {t.task_id: list(t.rerun) for t in plan.tasks if t.rerun}
    assert rerun == {"events[1]": [3], **{f"tally[{i}]": [3, 4, 5, 6] for i in range(4)}, "report": [3, 4, 5, 6]}
    assert len(plan.clear_downstream_set()) == 4 + 16 + 4


def test_one_to_one_needs_equal_partition_counts() -> None:
    with pytest.raises(PartitionError, match="one-to-one needs equal partition counts"):
        processor_edges("a", "b", OneToOne(), {"a": 2, "b": 3})


def test_garbage_collection_keeps_a_watermark_per_partition_and_names_each_partitions_tables() -> None:
    from falkirk.policies.planning.collector import plan_collection

    pipe, _ = reference_rows(5)
    # tally (LazyCheckpoint every=2) logs its outputs and is durable at epoch 4 in every partition
    pipe = dataclasses.replace(pipe, regimes={**pipe.regimes, "tally": LazyCheckpoint(every=2, log_outputs=True)})
    rows = history(pipe, 5, None, 0)
    rows = [r for r in rows if not (r.processor == "tally[3]" and r.epoch == 4)] + [
        dataclasses.replace(r, state_uri=r.state_uri.replace("/durable/", "/scratch/"), state_tier="scratch")
        for r in rows if r.processor == "tally[3]" and r.epoch == 4]  # tally[3] lost its durable copy of 4
    durable = lambda uri, key: uri.startswith("/durable")  # noqa: E731
    p = plan_collection("pipe", rows, pipe.graph(), durable, lambda uri: {e: 10 for e in range(1, 6)})
    assert {t: w for t, w in p.watermarks.items() if t.startswith("tally")} == {
        "tally[0]": 4, "tally[1]": 4, "tally[2]": 4, "tally[3]": 2}
    reclaimed = {(r.task_id, r.uri): r.epochs for r in p.tables if r.what == "state" and "durable" in r.uri}
    assert reclaimed[("tally[0]", "/durable/tally/0/state")] == (1, 2, 3)
    assert reclaimed[("tally[3]", "/durable/tally/3/state")] == (1,)
