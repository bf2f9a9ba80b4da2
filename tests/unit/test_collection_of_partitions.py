"""Garbage collection while a partition of a task has not committed yet.

A partitioned task's instances do not commit together: one can still be queued, or have failed
its first epoch, while the others have committed. The graph a collection works from comes from
the ledger, which has no row of that partition yet; it must still keep every epoch the
partition will read. The oracle is the collection planned on the pipeline's real graph (every
partition, every edge), on the same rows: what the ledger's graph lets go must be a part of
what the real graph lets go.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings, strategies as st

from falkirk.policies.ids import ProcessorId
from falkirk.policies import Batch, ProcessPairs
from falkirk.policies.planning.chains import DataEdge, TaskGraph
from falkirk.policies.planning.collector import plan_collection, with_partitions_yet_to_commit
from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef
from tests.unit.test_partition_plans import Pipeline, history, pipelines, reference_rows

DURABLE = lambda uri, key: uri.startswith("/durable")  # noqa: E731


def recorded(pipe: Pipeline, rows: list[LedgerEntry]) -> list[LedgerEntry]:
    """The rows as a job writes them: a partitioned task's rows carry its partition count."""
    return [dataclasses.replace(r, partitions=pipe.partitions[r.task_id]) for r in rows]


def behind(pipe: Pipeline, rows: list[LedgerEntry], processor: str, since: int) -> list[LedgerEntry]:
    """``rows`` without ``processor``'s epochs from ``since`` on, nor what Airflow would not have
    run without them: a later task's epochs (it waits for every map index of its upstream
    tasks), a stateful task's next epochs (``depends_on_past``), a window reaching them."""
    gone = {(processor, e) for e in range(since, max(r.epoch for r in rows) + 1)}
    reads = pipe.proc_edges()
    kept = []
    for r in sorted(rows, key=lambda r: (r.epoch, pipe.tasks.index(r.task_id))):
        upstream = [p for s, d, *_ in pipe.edges if d == r.task_id for p in pipe.procs(s)]
        windows = [(s, x) for s, d, back in reads if d == r.processor for x in range(max(r.epoch - back, 1), r.epoch)]
        past = pipe.regime(r.processor).keeps_state and any((q, r.epoch - 1) in gone for q in pipe.procs(r.task_id))
        if ((r.processor, r.epoch) in gone or any((u, r.epoch) in gone for u in upstream)
                or any(w in gone for w in windows) or past):
            gone.add((r.processor, r.epoch))
            continue
        kept.append(r)
    return kept


def reclaimed(plan) -> dict[tuple[str, str, str], set[int]]:
    return {(r.task_id, r.what, r.uri): set(r.epochs) for r in plan.tables}


def live(epochs: int):
    return lambda uri: {e: 10 for e in range(1, epochs + 1)}


@settings(max_examples=200, deadline=None)
@given(pipe=pipelines(), epochs=st.integers(2, 4), which=st.integers(0, 10), since=st.integers(1, 3))
def test_the_ledgers_graph_never_lets_go_more_than_the_real_one(pipe: Pipeline, epochs: int, which: int,
                                                                 since: int) -> None:
    rows = recorded(pipe, history(pipe, epochs, None, 0))
    partitioned = [p for p in pipe.all_procs if pipe.partitions[ProcessorId.parse(p).task]]
    if partitioned:  # one partition has not committed its epochs from `since` on (1: none yet)
        rows = behind(pipe, rows, partitioned[which % len(partitioned)], since)
    ledgers = with_partitions_yet_to_commit(TaskGraph.from_ledger(rows), rows)
    assert {p for p in pipe.all_procs if any(r.task_id == ProcessorId.parse(p).task for r in rows)} <= set(ledgers.tasks)
    ours = reclaimed(plan_collection("pipe", rows, ledgers, DURABLE, live(epochs)))
    real = reclaimed(plan_collection("pipe", rows, pipe.graph(), DURABLE, live(epochs)))
    for table, epochs_gone in ours.items():
        assert epochs_gone <= real.get(table, set()), (table, epochs_gone, real.get(table))


def test_a_partition_yet_to_commit_keeps_the_epochs_it_will_read() -> None:
    """events (4 partitions, logged) -> tally (4 partitions, logged, stateless) -> report:
    tally[0] has not committed anything yet (so neither has report); the other partitions of
    tally have committed epochs 1-5."""
    pipe, _ = reference_rows(5)
    pipe = dataclasses.replace(pipe, regimes={**pipe.regimes, "tally": Batch(log_outputs=True)})
    rows = behind(pipe, recorded(pipe, history(pipe, 5, None, 0)), "tally[0]", 1)
    assert {r.processor for r in rows} == {*(f"events[{i}]" for i in range(4)), "tally[1]", "tally[2]", "tally[3]"}
    graph = with_partitions_yet_to_commit(TaskGraph.from_ledger(rows), rows)
    # tally[0] reads every events partition (repartitioned by user), from epoch 1 on
    assert [e.src for e in graph.edges if e.dst == "tally[0]"] == [f"events[{i}]" for i in range(4)]
    plan = plan_collection("pipe", rows, graph, DURABLE, live(5))
    assert plan.watermarks["tally[0]"] == 0
    assert {t for t, what, _ in reclaimed(plan) if what == "output"} == set()
    # The ledger's graph alone lets every epoch of events go (the other partitions have read
    # them all): the hole this closes.
    without = reclaimed(plan_collection("pipe", rows, TaskGraph.from_ledger(rows), DURABLE, live(5)))
    assert {k[0]: v for k, v in without.items() if k[1] == "output"} == {f"events[{i}]": {1, 2, 3, 4, 5}
                                                                         for i in range(4)}
    # Outside the outputs tally[0] reads, both plans agree: the other partitions' checkpoints go.
    assert {k: v for k, v in without.items() if k[1] == "state"} == {k: v for k, v in reclaimed(plan).items()
                                                                     if k[1] == "state"}


def test_process_pairs_count_both_replicas_and_leave_out_one_taken_over() -> None:
    """stats runs 2 partitions as pairs (map indexes 0-3); replica 2 has not committed yet,
    replica 3 was taken over by its twin."""
    def row(task: str, i: int, inputs: tuple[InputRef, ...] = ()) -> LedgerEntry:
        return LedgerEntry(dag_id="d", task_id=task, epoch=1, regime=ProcessPairs().spec(), run_id="epoch-1", try_number=1, map_index=i, partitions=2, replicas=2,
                           outputs=(OutputRef("output", f"/durable/{task}/{i}/output", "durable", 1, 1),),
                           inputs=inputs)
    rows = [row("sessions", i) for i in range(4)]
    rows += [row("stats", i, (InputRef(task_id="sessions", output="output", through=1, map_index=0),)) for i in (0, 1)]
    graph = with_partitions_yet_to_commit(TaskGraph.from_ledger(rows), rows, leave_out={"stats[3]"})
    assert [t for t in graph.tasks if t.startswith("stats")] == ["stats[0]", "stats[1]", "stats[2]"]
    assert [e for e in graph.edges if e.dst == "stats[2]"] == [DataEdge(f"sessions[{i}]", "output", "stats[2]")
                                                               for i in range(4)]


def test_rows_written_before_partitions_were_recorded_add_nothing() -> None:
    rows = [LedgerEntry(dag_id="d", task_id="events", epoch=1, regime=Batch(log_outputs=True).spec(), run_id="epoch-1", try_number=1, map_index=1)]
    graph = TaskGraph.from_ledger(rows)
    assert with_partitions_yet_to_commit(graph, rows) == graph
