"""What a replay does next with each task instance of its plan, decided from what it has read.

The replay's executor (``falkirk.plugins.recovery``) reads Airflow's states, the ledger and the
completions log, asks these functions, and carries the answers out through Airflow:

* :func:`clears_needed`: which of the plan's instances to clear, and which to mark success;
* :func:`marks_in_order`: which failed instances of the epochs the plan keeps to mark success;
* :func:`rows_to_sweep` (with :func:`affected_later`): which rows of later DAG runs were
  computed from rolled-back epochs and are invalidated in turn;
* :func:`slots_to_free`: which later runs to queue again so that the re-runs can start;
* :func:`wait_verdict`: whether the re-runs are done, one failed (stop), or to poll again;
* :func:`runs_to_settle`: which DAG runs, all of whose instances now succeeded, to set to success
  (Airflow leaves a run failed when its failed instances are marked success rather than re-run),
  and which, with instances Airflow cleared but never started, to queue again.

Kept apart, each decision is plain data in, plain data out: they are tested against an
in-memory Airflow over hundreds of interleavings of kills, commits and new runs
(``tests/unit/test_replay_interleavings.py``) without starting anything.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from falkirk.policies.ids import ProcessorId

Instance = tuple[ProcessorId, int]
"""A task instance of the plan: (processor id, epoch)."""

SETTLED = frozenset({"success", "failed", "upstream_failed", "skipped", "removed"})
"""Airflow states in which an instance will not run again unless cleared."""
FAILED = frozenset({"failed", "upstream_failed"})


@dataclass(frozen=True)
class AirflowRun:
    """One DAG run as Airflow showed it: each instance's state and queue, and the run's state."""

    states: Mapping[ProcessorId, str | None]
    queues: Mapping[ProcessorId, str | None] = field(default_factory=dict)
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


def marks_in_order(kept: Collection[Instance], states: Mapping[int, Mapping[ProcessorId, str | None]],
                   reach: Mapping[ProcessorId, int]) -> list[Instance]:
    """Of ``kept`` (instances of the plan's epochs that it keeps: committed, current, completed),
    those Airflow shows failed, in the order to mark them success: by epoch, then the task
    furthest downstream first (``reach``: how many tasks are downstream of it). Airflow clears
    the failed instances downstream of one marked success, so marking downstream first leaves
    Airflow nothing of the kept ones to clear.

    >>> marks_in_order({("clean", 2), ("model", 2), ("sink", 2)},
    ...                {2: {"clean": "success", "model": "failed", "sink": "upstream_failed"}},
    ...                reach={"clean": 2, "model": 1, "sink": 0})
    [('sink', 2), ('model', 2)]
    """
    order = sorted(kept, key=lambda k: (k[1], reach.get(k[0], 0), k[0]))
    return [(t, e) for t, e in order if states.get(e, {}).get(t) in FAILED]


@dataclass(frozen=True)
class Wait:
    """Where waiting for a set of task instances stands: ``done`` (all succeeded), or the first
    one that ``failed`` (the replay stops there and is resumed once its cause is fixed), or
    neither (poll again)."""

    done: int
    total: int
    failed: tuple[Instance, str | None] | None = None

    @property
    def finished(self) -> bool:
        return self.failed is None and self.done == self.total


def wait_verdict(todo: Collection[Instance], states: Mapping[Instance, str | None]) -> Wait:
    """How waiting for ``todo`` stands, given each instance's Airflow state.

    >>> wait_verdict([("a", 1), ("b", 1)], {("a", 1): "success", ("b", 1): "running"})
    Wait(done=1, total=2, failed=None)
    >>> wait_verdict([("a", 1), ("b", 1)], {("a", 1): "success", ("b", 1): "upstream_failed"}).failed
    (('b', 1), 'upstream_failed')
    >>> wait_verdict([("a", 1)], {("a", 1): "success"}).finished
    True

    A replica of a paired task that its twin took over ends skipped: done as well.

    >>> wait_verdict([("s[2]", 3), ("s[3]", 3)], {("s[2]", 3): "skipped", ("s[3]", 3): "success"}).finished
    True
    """
    ordered = sorted(todo, key=lambda k: (k[1], k[0]))
    failed = next(((k, states[k]) for k in ordered if states.get(k) in FAILED), None)
    return Wait(sum(states.get(k) in ("success", "skipped") for k in ordered), len(ordered), failed)


@dataclass(frozen=True)
class Settle:
    """The DAG runs to set to success, those to queue again, and why each other failed run stays
    failed."""

    success: tuple[str, ...]
    left: dict[str, str] = field(default_factory=dict)
    requeue: tuple[str, ...] = ()


DONE = frozenset({"success", "skipped", "removed"})
"""Airflow states of a task instance that let its DAG run count as successful."""


def runs_to_settle(runs: Mapping[str, tuple[str | None, Mapping[ProcessorId, str | None]]]) -> Settle:
    """Of the replay's DAG runs (``run id -> (run state, {processor: instance state})``), those
    to set to success: failed runs whose every instance is now done; and those to queue again:
    failed runs whose instances not done are all not started. (Airflow clears the instances
    downstream of one the replay marks success, but leaves their run failed, and the scheduler
    never starts an instance of a failed run.) A failed run with an instance failed stays
    failed, with the instances named.

    >>> s = runs_to_settle({"epoch-3": ("failed", {"a": "success", "b": "success"}),
    ...                     "epoch-4": ("failed", {"a": "success", "notify": "failed"}),
    ...                     "epoch-5": ("success", {"a": "success"}), "epoch-6": ("running", {"a": "running"}),
    ...                     "epoch-7": ("failed", {"a": "success", "b": None})})
    >>> s.success, s.left, s.requeue
    (('epoch-3',), {'epoch-4': 'notify is failed'}, ('epoch-7',))
    """
    success, left, requeue = [], {}, []
    for run, (state, instances) in sorted(runs.items()):
        if state != "failed":
            continue
        not_done = {t: st for t, st in instances.items() if st not in DONE}
        if not not_done:
            success.append(run)
        elif all(st is None for st in not_done.values()):
            requeue.append(run)
        else:
            left[run] = ", ".join(sorted(f"{t} is {st or 'not started'}" for t, st in not_done.items()))
    return Settle(tuple(success), left, tuple(requeue))


@dataclass(frozen=True)
class Slots:
    """What to do about the DAG's ``max_active_runs`` slots: the later runs to queue again, and a
    diagnosis when the slots are held by runs the replay cannot free (else ``None``)."""

    requeue: tuple[str, ...] = ()
    stuck: str | None = None


def slots_to_free(active: Sequence[Mapping[str, str | None]], waiting: Collection[str], limit: int | None) -> Slots:
    """Free the DAG run slots that later epochs hold while the epochs a replay waits for stay queued.

    Airflow clears a finished run back to queued but leaves a running one running. Under
    ``max_active_runs``, a later epoch's run that is still running (its stateful task waiting, by
    ``depends_on_past``, for an epoch the replay cleared) holds a slot the cleared epoch's queued
    run needs: neither ever moves. Such runs are queued again (Airflow then starts the cleared,
    earlier runs first). ``active``: the DAG's active runs (``dag_run_id``, ``state``,
    ``logical_date``); ``waiting``: the runs of the instances the replay waits for.

    >>> active = [{"dag_run_id": "e2", "state": "queued", "logical_date": "2"},
    ...           {"dag_run_id": "e3", "state": "running", "logical_date": "3"}]
    >>> slots_to_free(active, waiting={"e2"}, limit=1)
    Slots(requeue=('e3',), stuck=None)
    >>> slots_to_free(active, waiting={"e2"}, limit=2)   # a slot is free
    Slots(requeue=(), stuck=None)
    >>> slots_to_free([active[0], {"dag_run_id": "e1", "state": "running", "logical_date": "1"}], {"e2"}, 1).stuck[:25]
    'the re-runs of e2 stay qu'
    """
    queued = [r for r in active if r["state"] == "queued" and r["dag_run_id"] in waiting]
    holding = [r for r in active if r["state"] == "running"]
    if not queued or not holding or not limit or len(holding) < limit:
        return Slots()
    first = min(r["logical_date"] or "" for r in queued)
    later = tuple(str(r["dag_run_id"]) for r in holding if (r["logical_date"] or "") > first)
    if later or all(r["dag_run_id"] in waiting for r in holding):
        return Slots(later)  # requeued; or the slots are the replay's own earlier runs, which finish by themselves
    return Slots(stuck=(
        f"the re-runs of {', '.join(sorted(str(r['dag_run_id']) for r in queued))} stay queued: the DAG's "
        f"max_active_runs={limit} slots are held by {', '.join(sorted(str(r['dag_run_id']) for r in holding))}, "
        f"which are not later epochs this replay can queue again; let those runs finish (or mark them failed), or "
        f"raise max_active_runs"))


def affected_later(downstream: Mapping[ProcessorId, Collection[ProcessorId]], redone: Collection[ProcessorId],
                   keeps_state: Collection[ProcessorId]) -> set[ProcessorId]:
    """The tasks whose epochs after a plan's last one depend on epochs the plan redoes: the
    stateful tasks it re-runs, and every task downstream of a task it re-runs (``downstream``:
    each task's downstream tasks, itself excluded).

    >>> affected_later({"source": {"clean", "model"}, "clean": {"model"}, "model": set()},
    ...                redone={"clean"}, keeps_state={"model"})
    {'model'}
    """
    return {t for t in redone if t in keeps_state} | {d for t in redone for d in downstream.get(t, ())}


@dataclass(frozen=True, kw_only=True)
class LaterRow:
    """What the sweep reads of a ledger row of an epoch after the plan's last one."""

    processor: str
    epoch: int
    incarnation: int
    rollbacks_seen: int | None  # the rollbacks' version its job checked just before appending it
    committed_at: datetime


SWEPT_HERE = -2  # the version of a rollback this sweep is about to record: after every check so far


@dataclass(frozen=True)
class RolledBack:
    """A row the plan (or its sweep) rolled back, and the rollbacks' version that recorded it
    (``None``: the log no longer holds that commit)."""

    processor: str
    epoch: int
    version: int | None


def rows_to_sweep(rows: Iterable[LaterRow], last_epoch: int, affected: Collection[str],
                  rolled_back: Iterable[RolledBack], upstream: Mapping[str, Collection[str]],
                  since: datetime | None = None, clock_skew: timedelta = timedelta(seconds=5)) -> list[LaterRow]:
    """The current rows of epochs after ``last_epoch`` of the ``affected`` tasks that may have been
    computed from a row the plan rolled back, to be invalidated in turn.

    A row may have read a rolled-back row of a task upstream of it (``upstream[task]``, the task
    itself included) at its own epoch or an earlier one, unless its job checked the rollbacks
    after that row was rolled back: "after" is the order of the store's own commits, never a
    clock (``rollbacks_seen`` against the ``version`` that recorded the rollback), and a job that
    finds a row it read rolled back refuses or withdraws its own commit. The sweep is transitive:
    a row computed from a row swept here is swept too, since it read it while it was current.

    Only a row written before jobs recorded ``rollbacks_seen`` (or a rollback whose commit the log
    no longer holds) is judged by stamps: computed before ``since`` (when the plan rolled back),
    within ``clock_skew``.

    >>> at = datetime(2026, 1, 1)
    >>> up = {"source": {"source"}, "model": {"source", "model"}, "sink": {"source", "model", "sink"}}
    >>> rows = [LaterRow(processor="model", epoch=6, incarnation=0, rollbacks_seen=3, committed_at=at), LaterRow(processor="model", epoch=7, incarnation=0, rollbacks_seen=4, committed_at=at), LaterRow(processor="sink", epoch=7, incarnation=0, rollbacks_seen=4, committed_at=at)]
    >>> plan = [RolledBack("model", 5, version=4)]
    >>> [(r.processor, r.epoch) for r in rows_to_sweep(rows, 5, {"model", "sink"}, plan, up)]
    [('model', 6), ('model', 7), ('sink', 7)]

    (model 6 checked the rollbacks before model 5 was rolled back; model 7 and sink 7 checked them
    after, but read model 6, which is swept.)
    """
    rolled = list(rolled_back)
    later = sorted((r for r in rows if r.epoch > last_epoch and r.processor in affected),
                   key=lambda r: (r.epoch, r.processor))

    def read_before(row: LaterRow, gone: RolledBack) -> bool:
        if gone.processor not in upstream.get(row.processor, (row.processor,)) or gone.epoch > row.epoch:
            return False
        if gone.version == SWEPT_HERE:
            return True
        if row.rollbacks_seen is not None and gone.version is not None:
            return row.rollbacks_seen < gone.version
        return since is None or row.committed_at < since + clock_skew

    swept: list[LaterRow] = []
    changed = True
    while changed:  # to a fixpoint: what is swept here counts as rolled back after every check
        changed = False
        for row in later:
            if row not in swept and any(read_before(row, g) for g in rolled):
                swept.append(row)
                rolled.append(RolledBack(row.processor, row.epoch, version=SWEPT_HERE))
                changed = True
    return sorted(swept, key=lambda r: (r.epoch, r.processor))
