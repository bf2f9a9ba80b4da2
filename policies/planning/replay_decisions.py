"""What a replay does next with each task instance of its plan, decided from what it has read.

The replay's executor (``falkirk.plugins.recovery``) reads Airflow's states, the ledger and the
completions log, asks :func:`clears_needed`, and carries the answer out through Airflow. Kept
apart, the decision is plain data in, plain data out: it is tested against an in-memory
Airflow over hundreds of interleavings of kills, commits and new runs
(``tests/unit/test_replay_interleavings.py``) without starting anything.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

Instance = tuple[str, int]
"""A task instance of the plan: (processor id, epoch)."""

SETTLED = frozenset({"success", "failed", "upstream_failed", "skipped", "removed"})
"""Airflow states in which an instance will not run again unless cleared."""
FAILED = frozenset({"failed", "upstream_failed"})


@dataclass(frozen=True)
class AirflowRun:
    """One DAG run as Airflow showed it: each instance's state and queue, and the run's state."""

    states: Mapping[str, str | None]
    queues: Mapping[str, str | None] = field(default_factory=dict)
    state: str | None = None


@dataclass(frozen=True)
class Clears:
    """The instances to clear, and those to mark success instead (their epoch is committed and
    completed, so a re-run would be refused)."""

    clear: frozenset[Instance]
    mark_success: tuple[Instance, ...]


def clears_needed(wanted: Collection[Instance], runs: Mapping[int, AirflowRun], committed: Collection[Instance],
                  completed: Collection[Instance], lost_queues: Collection[str] = ()) -> Clears:
    """Of ``wanted`` (the plan's re-run set), what still needs a clear.

    ``runs`` must have been read *before* ``committed`` (the instances with a current ledger row)
    and ``completed``: a task commits before Airflow marks it success, so an instance seen settled
    has its row in the later read. An instance:

    * committed and not failed in Airflow: done, left alone;
    * committed, failed in Airflow, and its epoch completed: marked success (its state update was
      lost; a re-run of a completed epoch is refused);
    * otherwise settled in Airflow, never run in a run that ended, or waiting on the queue of a
      lost worker: cleared (a failed one that committed re-runs as a no-op that finds its commit).

    Anything queued or running is left to finish: a resumed replay never clears what the
    previous executor already cleared.

    >>> runs = {4: AirflowRun({"clean": "success", "model": "failed", "sink": "upstream_failed"}, state="failed"),
    ...         5: AirflowRun({"model": "running", "sink": None}, state="running")}
    >>> wanted = [("clean", 4), ("model", 4), ("sink", 4), ("model", 5), ("sink", 5)]
    >>> clears_needed(wanted, runs, committed={("clean", 4), ("model", 4)}, completed={("model", 4)})
    Clears(clear=frozenset({('sink', 4)}), mark_success=(('model', 4),))
    """
    lost = set(lost_queues)
    clear: set[Instance] = set()
    mark: list[Instance] = []
    for epoch in sorted({e for _, e in wanted}):
        run = runs[epoch]
        for task in sorted(t for t, e in wanted if e == epoch):
            state = run.states.get(task)
            if (task, epoch) in committed and state not in FAILED:
                continue
            if (task, epoch) in completed:
                mark.append((task, epoch))
                continue
            stranded = run.queues.get(task) in lost and state not in ("running", "restarting")
            if state in SETTLED or (state is None and run.state in ("success", "failed")) or stranded:
                clear.add((task, epoch))
    return Clears(frozenset(clear), tuple(mark))
