"""Recovery plans: from failures and the ledger to each task's frontier and the exact re-run set.

Three kinds of failure go in:

* :class:`FailedTask`: a task instance failed (Airflow marked it failed); the task has
  nothing trustworthy from that epoch on;
* :class:`LostScratch`: a scratch location is gone (a worker's directory): every table
  under it is unreadable, so checkpoints kept only there cannot be restored and outputs
  kept only there count as discarded;
* :class:`LostWorker`: a worker is gone with its local disk: every scratch table the ledger
  records it committed is unreadable (a :class:`LostScratch` of exactly those tables);
* :class:`BadEpoch`: a person declares a task's epoch bad (a wrong input was corrected):
  its checkpoints from that epoch on are unusable.

The planner builds every task's F*(p) with exact Ξ from the ledger
(:mod:`falkirk.policies.planning.chains`), applies the failures, runs the solver, and reads the
answer back in Airflow's terms: each task keeps the epochs up to its frontier; a
stateful task re-runs every later epoch up to the last DAG run, a stateless one only
the later epochs whose input changes or whose output is missing (its epochs do not
depend on one another). It also states what each re-run
restores (the state checkpoint it starts from) and re-reads (upstream outputs kept in a
log), and, for comparison, what Airflow's "clear with downstream and future" from each
failure would have re-run.

Plans are deterministic: the same ledger and the same failures give the same plan and
the same ``plan_id``. The plan records the ledger's Delta version, so an executor can
refuse a plan computed from a ledger that has changed since.

>>> from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef
>>> from falkirk.policies.planning.chains import TaskGraph
>>> def row(task, t, regime, inputs=(), state=False):
...     out = (OutputRef("output", f"/d/{task}/output", "durable", t, 1),)
...     return LedgerEntry(dag_id="d", task_id=task, epoch=t, regime=regime, run_id=f"r{t}", try_number=1, notified_through=t, outputs=out,
...                        inputs=tuple(InputRef(task_id=i, output="output", through=t) for i in inputs),
...                        state_uri=f"/d/{task}/state" if state else None)
>>> rows = [row("a", t, "batch(log_outputs=true)") for t in (1, 2, 3)]
>>> rows += [row("b", t, "eager_checkpoint", ["a"], state=True) for t in (1, 2)]  # b failed at epoch 3
>>> graph = TaskGraph(("a", "b"), TaskGraph.from_ledger(rows).edges)
>>> plan = plan_recovery("d", graph, rows, [FailedTask("b", 3)], last_epoch=3,
...                      readable=lambda uri, key: True)
>>> sorted(plan.rerun_set()), sorted(plan.clear_downstream_set())
([('b', 3)], [('b', 3)])
>>> plan.task("b").restore_from.epoch, plan.task("b").rereads
(2, (('a', 'output', (3,)),))
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from falkirk.policies.ids import ProcessorId
from falkirk.policies.planning.chains import TaskGraph, chains_from_ledger, current_rows, reads_back, sent_undelivered
from falkirk.policies.planning.replay_decisions import Instance
from falkirk.policies.regimes import Regime, SenderLog
from falkirk.policies.rollback.solver import solve
from falkirk.policies.rollback.times import EPOCH
from falkirk.policies.store.ledger import LedgerEntry, OutputRef  # noqa: F401 (OutputRef: doctests)
from falkirk.policies.store.readability import Readable, under, without
from falkirk.policies.store.steps import StepCheckpoint


class PlanError(ValueError):
    """A recovery that cannot be planned as asked; the message names the field and the fix."""


@dataclass(frozen=True)
class FailedTask:
    """Task instance (``task_id``, ``epoch``) failed. ``task_id`` names a task, one partition
    ``task[i]`` of a partitioned task (its mapped task instance), or, bare, all its partitions."""

    task_id: str
    epoch: int

    def describe(self) -> str:
        return f"failed task {self.task_id} at epoch {self.epoch}"


@dataclass(frozen=True)
class LostScratch:
    """Everything stored under ``location`` (a scratch directory) is gone."""

    location: str

    def describe(self) -> str:
        return f"lost scratch {self.location}"


@dataclass(frozen=True)
class LostWorker:
    """Worker ``worker`` is gone, and with it every scratch table it kept on its local disk."""

    worker: str

    def describe(self) -> str:
        return f"lost worker {self.worker}"


@dataclass(frozen=True)
class BadEpoch:
    """Epoch ``epoch`` of ``task_id`` is bad: its checkpoints from that epoch on are unusable.
    ``task_id`` names a task, one partition ``task[i]``, or, bare, every partition of a task."""

    task_id: str
    epoch: int

    def describe(self) -> str:
        return f"bad epoch {self.epoch} of {self.task_id}"


@dataclass(frozen=True)
class DiscardedEpochs:
    """Epochs ``first`` to ``last`` were withdrawn (``falkirk discard``): DAG runs made by
    mistake. Not a failure to plan for: the record of a discard in the recovery log, whose
    plan re-runs nothing and rolls back every row of those epochs."""

    first: int
    last: int
    runs: tuple[str, ...] = ()  # the DAG runs it deleted (two discards of one epoch differ by them)

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs", tuple(self.runs))  # read back from JSON as a list

    def describe(self) -> str:
        return f"discarded epochs {self.first}..{self.last}"


Failure = FailedTask | LostScratch | LostWorker | BadEpoch | DiscardedEpochs


@dataclass(frozen=True)
class StateRef:
    """The checkpointed state a rolled-back task restarts from."""

    epoch: int
    uri: str
    version: int | None
    tier: str | None


@dataclass(frozen=True)
class StepRef:
    """A checkpoint inside the first epoch a task re-runs, which the re-run resumes from: its
    frontier is the lex time (``epoch``, ``step``) (:mod:`falkirk.policies.store.steps`)."""

    epoch: int
    step: int
    of: int
    kind: str
    uri: str

    def describe(self) -> str:
        return f"{self.kind} {self.step} of {self.of} of epoch {self.epoch}"


@dataclass(frozen=True)
class TaskPlan:
    """One task's part of a plan: its frontier f(p), written as the last epoch it keeps
    (``kept_through``; 0: none, restart from ∅), and its notification frontier f_n(p), as the
    last epoch whose completion it keeps having acted on (``notified_through``).

    ``task_id`` names the processor: the task, or one partition ``task[i]`` of a partitioned
    task (each partition has a part of its own; see :mod:`falkirk.policies.partitions`)."""

    task_id: ProcessorId
    regime: str
    kept_through: int
    notified_through: int
    rerun: tuple[int, ...]
    restore_from: StateRef | None
    # (upstream task, output, epochs): logged upstream outputs the re-runs read again
    rereads: tuple[tuple[str, str, tuple[int, ...]], ...]
    clear_downstream: tuple[int, ...]
    # The re-run's first epoch resumes from this checkpoint inside it (recorded only when set).
    resume_from: StepRef | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.task_id, ProcessorId):  # a recorded plan names it in its wire form
            object.__setattr__(self, "task_id", ProcessorId.parse(self.task_id))


# A plan's wire form (the recovery log, ``falkirk plan --json``, the view) names a task's two
# frontiers as the specification does: f(p) ``frontier`` and f_n(p) ``notification_frontier``.
_WIRE = {"kept_through": "frontier", "notified_through": "notification_frontier"}
_FIELDS = {v: k for k, v in _WIRE.items()}


@dataclass(frozen=True)
class RecoveryPlan:
    """What a recovery will do; see the module docstring."""

    dag_id: str
    failures: tuple[Failure, ...]
    last_epoch: int
    # The DAG's ledger version when the plan was computed (Ledger.dag_version): a replay refuses
    # the plan once it has moved.
    ledger_version: int | None
    tasks: tuple[TaskPlan, ...]

    @property
    def plan_id(self) -> str:
        """A content hash: the same ledger and failures always give the same id."""
        body = json.dumps(self._body(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:12]

    def task(self, task_id: str) -> TaskPlan:
        for t in self.tasks:
            if t.task_id == task_id:
                return t
        raise KeyError(task_id)

    def rerun_set(self) -> frozenset[Instance]:
        """Every (task, epoch) the recovery re-runs (a partition as ``task[i]``)."""
        return frozenset((t.task_id, e) for t in self.tasks for e in t.rerun)

    def clear_downstream_set(self) -> frozenset[Instance]:
        """What Airflow's clear with downstream and future, from each failure, would re-run."""
        return frozenset((t.task_id, e) for t in self.tasks for e in t.clear_downstream)

    def clear_downstream_misses(self) -> frozenset[Instance]:
        """The re-runs clear-downstream would not make: when there are any, it cannot recover at
        all (a stateful task would find the checkpoint it builds on gone, or an epoch stay stale)."""
        return self.rerun_set() - self.clear_downstream_set()

    def clear_downstream_verdict(self) -> str:
        """What clear-downstream would do, in a sentence: how much it re-runs, or why it cannot recover."""
        theirs, missed = len(self.clear_downstream_set()), sorted(self.clear_downstream_misses(),
                                                                  key=lambda m: (m[1], m[0]))
        if not missed:
            return f"clear-downstream would re-run {theirs}"
        first = ", ".join(f"{t}@{e}" for t, e in missed[:3]) + (", ..." if len(missed) > 3 else "")
        return (f"clear-downstream could not recover: it would re-run {theirs} but not the {len(missed)} this plan "
                f"needs before them ({first})")

    def to_json(self) -> dict:
        return {**self._body(), "plan_id": self.plan_id}

    @classmethod
    def from_json(cls, data: Mapping) -> RecoveryPlan:
        kinds = {"failed_task": FailedTask, "lost_scratch": LostScratch, "lost_worker": LostWorker,
                 "bad_epoch": BadEpoch, "discarded_epochs": DiscardedEpochs}
        failures = tuple(kinds[f.pop("kind")](**f) for f in (dict(x) for x in data["failures"]))
        tasks = tuple(
            TaskPlan(**{**{_FIELDS.get(k, k): v for k, v in t.items()},
                        "rerun": tuple(t["rerun"]), "clear_downstream": tuple(t["clear_downstream"]),
                        "restore_from": StateRef(**t["restore_from"]) if t["restore_from"] else None,
                        "rereads": tuple((a, b, tuple(c)) for a, b, c in t["rereads"]),
                        "resume_from": StepRef(**t["resume_from"]) if t.get("resume_from") else None})
            for t in data["tasks"])
        plan = cls(data["dag_id"], failures, data["last_epoch"], data["ledger_version"], tasks)
        if "plan_id" in data and data["plan_id"] != plan.plan_id:
            raise PlanError(f"plan_id {data['plan_id']!r} does not match the plan's content ({plan.plan_id}); "
                            f"the plan was edited: compute it again with `falkirk plan`")
        return plan

    def table(self) -> str:
        """The plan for people: per task, its frontier, what it re-runs, and clear-downstream's count."""
        rows = [["task", "regime", "keeps epochs", "re-runs", "restores", "clear-downstream re-runs"]]
        for t in self.tasks:
            restores = (f"state of epoch {t.restore_from.epoch}" if t.restore_from else
                        ("empty state" if Regime.parse(t.regime).keeps_state and t.rerun else "-"))
            if t.restore_from and isinstance(Regime.parse(t.regime), SenderLog):
                restores += " (from scratch, or rebuilt from the input epochs not released)"
            if t.resume_from:
                restores = f"{t.resume_from.describe()}" + (f" (on {restores})" if restores != "-" else "")
            rows.append([t.task_id, t.regime, _kept(t), _span(t.rerun), restores, _span(t.clear_downstream)])
        ours = len(self.rerun_set())
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        head = (f"plan {self.plan_id} for {self.dag_id} (epochs 1..{self.last_epoch}): "
                + "; ".join(f.describe() for f in self.failures))
        return "\n".join([head, *lines, f"re-runs {ours} task instances; {self.clear_downstream_verdict()}"])

    def _body(self) -> dict:
        kind = {FailedTask: "failed_task", LostScratch: "lost_scratch", LostWorker: "lost_worker",
                BadEpoch: "bad_epoch", DiscardedEpochs: "discarded_epochs"}
        return {
            "dag_id": self.dag_id,
            "failures": [{"kind": kind[type(f)], **asdict(f)} for f in self.failures],
            "last_epoch": self.last_epoch,
            "ledger_version": self.ledger_version,
            "tasks": [{**{_WIRE.get(k, k): v for k, v in asdict(t).items()
                          if k != "resume_from" or v is not None},
                       "rerun": list(t.rerun), "clear_downstream": list(t.clear_downstream),
                       "rereads": [[a, b, list(c)] for a, b, c in t.rereads]} for t in self.tasks],
        }


def plan_recovery(
    dag_id: str,
    graph: TaskGraph,
    entries: Iterable[LedgerEntry],
    failures: Iterable[Failure],
    last_epoch: int,
    readable: Readable,
    regimes: Mapping[ProcessorId, Regime] | None = None,
    ledger_version: int | None = None,
    first_epoch: int = 1,
    steps: Iterable[StepCheckpoint] = (),
) -> RecoveryPlan:
    """The recovery plan for ``failures`` (see the module docstring).

    ``regimes`` gives the regime of tasks that have no ledger row yet (from the DAG);
    ``last_epoch`` is the latest epoch with a DAG run, up to which re-runs go. ``steps``: the
    checkpoints inside epochs, of the incarnation each epoch's next run commits under; a
    task's frontier may then be a lex time (epoch, step) inside its first re-run epoch
    (:func:`_resume_points`).
    """
    failures = tuple(failures)
    if not failures:
        raise PlanError("failures: name at least one (a failed task, a lost scratch location or a bad epoch)")
    rows = [e for e in entries if e.dag_id == dag_id]
    given = {p: r.spec() for p, r in (regimes or {}).items()}
    regime_text: dict[ProcessorId, str] = {}
    for e in rows:
        regime_text.setdefault(e.processor, e.regime)
    for p in graph.tasks:  # the DAG's regime names a task, or one of its partitions
        whole = ProcessorId(task=p.task)
        if p not in regime_text and (p in given or whole in given):
            regime_text[p] = given.get(p) or given[whole]
    _check(graph, failures, last_epoch, first_epoch)

    for t in graph.tasks:
        if t not in regime_text:
            raise PlanError(f"task {t!r} has no ledger row and no regime was given; pass regimes= from the DAG")
    stateful = {t: Regime.parse(regime_text[t]).keeps_state for t in graph.tasks}

    # A failed or bad epoch taints a stateful task's rows from then on (its state carries
    # the epoch forward); a stateless task's epochs are independent, so only that row. A
    # failure naming a partitioned task names each of its partitions.
    untrusted: set[tuple[ProcessorId, int]] = set()
    failed: set[ProcessorId] = set()
    for f in failures:
        if isinstance(f, (FailedTask, BadEpoch)):
            for p in _named(graph, f.task_id):
                upto = last_epoch if stateful[p] else f.epoch
                untrusted.update((p, e) for e in range(f.epoch, upto + 1))
                if isinstance(f, FailedTask):
                    failed.add(p)
    lost = lost_locations(failures, rows)

    still_readable = without(readable, lost)
    back = reads_back(rows)

    # The solver's frontiers, then the re-runs they imply. A re-run may need an epoch of a
    # stateful task's output that task keeps but that can no longer be read (a windowed reader,
    # or a stateless task redoing a kept epoch, reads back into it): the state cannot produce
    # that epoch again, so its frontier must fall below it. Drop those rows and solve again;
    # every consistent answer falls below them too, so the fixpoint is the greatest one.
    while True:
        # Records an external system has not accepted yet are sent again (Falkirk Wheel §4.3): such an
        # epoch is no checkpoint, and it re-runs like an epoch that never committed.
        kept = [e for e in rows if (e.processor, e.epoch) not in untrusted and e.epoch <= last_epoch
                and not sent_undelivered(e, still_readable)]
        chains = chains_from_ledger(kept, graph, still_readable, failed=sorted(failed), first_epoch=first_epoch)
        answer = solve(graph.solver_graph(failed=sorted(failed)), chains)
        kept_through = {t: max(EPOCH.last_through(answer.bound(t)), first_epoch - 1) for t in graph.tasks}
        by_epoch = {t: {e.epoch: e for e in rs} for t, rs in current_rows(kept).items()}
        rerun, unreadable = _rerun_sets(graph, kept_through, stateful, by_epoch, still_readable, last_epoch, back,
                                        first_epoch)
        if not unreadable:
            break
        for p, epoch in unreadable:
            untrusted.update((p, e) for e in range(epoch, last_epoch + 1))
    notified = {t: EPOCH.last_through(min(answer.notification[t], EPOCH.through_bound(last_epoch)))
                for t in graph.tasks}
    clear = _clear_downstream(graph, failures, current_rows(rows), last_epoch)
    bad = {(p, f.epoch) for f in failures if isinstance(f, BadEpoch) for p in _named(graph, f.task_id)}
    resume = _resume_points(steps, rerun, by_epoch, current_rows(rows), still_readable, bad)

    tasks = []
    for t in graph.tasks:
        regime = regime_text[t]
        restore = None
        if stateful[t] and kept_through[t] >= first_epoch and rerun[t]:
            row = by_epoch[t][kept_through[t]]
            restore = StateRef(row.epoch, row.state_uri or "", row.state_version, row.state_tier)
        rereads = []
        for edge in graph.edges:
            if edge.dst == t:
                b = back.get((edge.src, edge.output, t), 0)
                read = {y for x in rerun[t] for y in range(max(x - b, first_epoch), x + 1)}
                epochs = tuple(sorted(read - set(rerun[edge.src])))
                if epochs:
                    rereads.append((edge.src, edge.output, epochs))
        tasks.append(TaskPlan(t, regime, kept_through[t], notified[t], rerun[t], restore, tuple(rereads),
                              tuple(sorted(clear.get(t, ()))), resume.get(t)))
    return RecoveryPlan(dag_id, failures, last_epoch, ledger_version, tuple(tasks))


def _resume_points(steps: Iterable[StepCheckpoint], rerun: Mapping[ProcessorId, tuple[int, ...]],
                   kept: Mapping[ProcessorId, Mapping[int, LedgerEntry]],
                   current: Mapping[ProcessorId, list[LedgerEntry]],
                   readable: Readable, bad: set[tuple[ProcessorId, int]]) -> dict[ProcessorId, StepRef]:
    """Per processor, the checkpoint inside its first re-run epoch its re-run resumes from.

    The frontier of a processor whose epoch ``e`` never committed (its attempt failed, or is
    still running) may be a lex time (e, k) when its checkpoint at (e, k) is consistent with
    everyone else's frontier: the table still holds it, and every ledger row it was computed
    from (its state of e - 1, each input it read) is one the plan keeps, at the same
    incarnation. Epochs after ``e`` read epoch ``e``'s result only, so nothing downstream
    depends on where inside ``e`` the re-run starts (the egress projection (e, k) ↦ e - 1).
    An epoch with a ledger row (committed, now rolled back) has no checkpoints left inside it.
    """
    committed = {(p, r.epoch) for p, rs in current.items() for r in rs}
    best: dict[ProcessorId, StepRef] = {}
    for c in steps:
        p = c.processor
        if not rerun.get(p) or c.epoch != rerun[p][0] or (p, c.epoch) in committed:
            continue
        if any(q == p and e <= c.epoch for q, e in bad) or not readable(c.uri, c.key):
            continue
        held = all(d.epoch not in rerun.get(d.processor, ())
                   and getattr(kept.get(d.processor, {}).get(d.epoch), "incarnation", None) == d.incarnation
                   for d in c.depends_on)
        if held and (p not in best or c.step > best[p].step):
            best[p] = StepRef(c.epoch, c.step, c.of, c.kind, c.uri)
    return best


def _rerun_sets(graph: TaskGraph, kept_through: Mapping[ProcessorId, int], stateful: Mapping[ProcessorId, bool],
                by_epoch: Mapping[ProcessorId, Mapping[int, LedgerEntry]], readable: Readable,
                last_epoch: int, back: Mapping[tuple[ProcessorId, str, ProcessorId], int], first_epoch: int = 1,
                ) -> tuple[dict[ProcessorId, tuple[int, ...]], set[tuple[ProcessorId, int]]]:
    """The epochs each processor re-runs: past its frontier, all of them for a stateful one;
    and the (stateful processor, epoch) pairs a re-run needs, within that processor's frontier,
    whose output can no longer be read (none when the frontiers are consistent).

    A stateless task's epochs do not depend on one another, so one past its frontier
    re-runs an epoch only when it must: it has no usable row for it, an upstream task
    re-runs an epoch it reads (its input changes; with a window of ``back`` epochs, a redone
    epoch ``e`` is read by epochs ``e`` to ``e + back``), or a downstream task re-runs an
    epoch that reads this task's output of it and that output can no longer be read (for a
    windowed reader, even an epoch within this task's frontier). The rest keep their
    committed output.
    """
    later = {t: set(range(kept_through[t] + 1, last_epoch + 1)) for t in graph.tasks}
    rerun = {t: set(later[t]) if stateful[t] else {e for e in later[t] if e not in by_epoch.get(t, {})}
             for t in graph.tasks}
    unreadable: set[tuple[ProcessorId, int]] = set()

    def output_readable(task: ProcessorId, output: str, epoch: int) -> bool:
        row = by_epoch.get(task, {}).get(epoch)
        ref = next((o for o in row.outputs if o.name == output), None) if row else None
        return ref is not None and row is not None and readable(ref.uri, row.key)

    changed = True
    while changed:
        changed = False
        for edge in graph.edges:
            src, dst = edge.src, edge.dst
            b = back.get((src, edge.output, dst), 0)
            grow_dst = {x for e in rerun[src] for x in range(e, e + b + 1) if x in later[dst]} - rerun[dst]
            needed = {x for e in rerun[dst] for x in range(max(e - b, first_epoch), e + 1)
                      if x not in rerun[src] and not output_readable(src, edge.output, x)}
            # A stateless producer also redoes an epoch it keeps whose output a windowed reader
            # needs and can no longer read (kept, its rows are the same again); a stateful one
            # cannot (see plan_recovery).
            grow_src = {x for x in needed if x in later[src] or not stateful[src]}
            unreadable |= {(src, x) for x in needed - grow_src}
            for task, grow in ((dst, grow_dst), (src, grow_src)):
                if grow:
                    rerun[task] |= grow
                    changed = True
    return {t: tuple(sorted(rerun[t])) for t in graph.tasks}, unreadable


def _check(graph: TaskGraph, failures: tuple[Failure, ...], last_epoch: int, first_epoch: int) -> None:
    if last_epoch < first_epoch:
        raise PlanError(f"last_epoch={last_epoch}: the DAG has no run yet, so there is nothing to recover")
    for i, f in enumerate(failures):
        if isinstance(f, (FailedTask, BadEpoch)):
            if not _named(graph, f.task_id):
                raise PlanError(f"failures[{i}].task_id: unknown task {f.task_id!r}; the DAG's tasks are "
                                f"{', '.join(graph.tasks)}")
            if not isinstance(f.epoch, int) or not first_epoch <= f.epoch <= last_epoch:
                raise PlanError(f"failures[{i}].epoch: {f.epoch!r} is not an epoch that has run; "
                                f"choose one of {first_epoch}..{last_epoch}")
        elif isinstance(f, LostScratch):
            if not f.location or not f.location.strip():
                raise PlanError(f"failures[{i}].location: name the scratch directory that was lost")
        elif isinstance(f, LostWorker):
            if not isinstance(f.worker, str) or not f.worker.strip():
                raise PlanError(f"failures[{i}].worker: name the worker that was lost")
        else:
            raise PlanError(f"failures[{i}]: {f!r} is not a FailedTask, LostScratch, LostWorker or BadEpoch")


def _named(graph: TaskGraph, name: str) -> tuple[ProcessorId, ...]:
    """The processors a failure's ``task_id`` names: a task, one partition ``task[i]``, or every
    partition of a partitioned task."""
    named = ProcessorId.parse(name)
    if named in graph.tasks:
        return (named,)
    return tuple(p for p in graph.tasks if p.task == name and p != name)


def lost_locations(failures: Iterable[Failure], rows: Iterable[LedgerEntry]) -> tuple[str, ...]:
    """The locations ``failures`` take away: lost scratch directories, and each lost worker's
    scratch tables as the ledger ``rows`` record them.

    >>> row = LedgerEntry(dag_id="d", task_id="t", epoch=1, regime="ephemeral", run_id="r1", try_number=1, worker="worker-a",
    ...                   outputs=(OutputRef("output", "/s/worker-a/d/t/output", "scratch", 0, 5),))
    >>> lost_locations([LostWorker("worker-a"), LostScratch("/s/other")], [row])
    ('/s/other/', '/s/worker-a/d/t/output/')
    >>> lost_locations([LostWorker("worker-b")], [row])
    ()
    """
    rows = list(rows)
    lost = {_dir(f.location) for f in failures if isinstance(f, LostScratch)}
    gone = {f.worker for f in failures if isinstance(f, LostWorker)}
    lost |= {_dir(uri) for r in rows if r.worker in gone for uri in r.scratch_uris()}
    return tuple(sorted(lost))


def _clear_downstream(graph: TaskGraph, failures: tuple[Failure, ...], rows: Mapping[ProcessorId, list[LedgerEntry]],
                      last_epoch: int) -> dict[ProcessorId, set[int]]:
    """Airflow's "clear, downstream + future" from each failure's task instance.

    Airflow knows nothing of a lost scratch location or worker: clearing "and hoping" means
    clearing, with downstream and future, every task that kept data there, from the
    first epoch whose data was lost. Airflow's downstream is task-level: clearing partition
    ``t[i]`` clears that partition alone of ``t`` and every partition of the tasks downstream.
    """
    origins: list[tuple[ProcessorId, int]] = []
    for f in failures:
        if isinstance(f, (FailedTask, BadEpoch)):
            origins += [(p, f.epoch) for p in _named(graph, f.task_id)]
            continue
        where = lost_locations([f], [r for rs in rows.values() for r in rs])
        for task, rs in rows.items():
            hit = [r.epoch for r in rs if any(under(uri, where) for uri in (r.state_uri, *(o.uri for o in r.outputs))
                                               if uri)]
            if hit:
                origins.append((task, min(hit)))
    clear: dict[ProcessorId, set[int]] = {}
    for origin, epoch in origins:
        for t in [origin, *graph.tasks_downstream(origin.task)]:
            clear.setdefault(t, set()).update(range(epoch, last_epoch + 1))
    return clear


def _dir(location: str) -> str:
    return location.rstrip("/") + "/"


def _span(epochs: tuple[int, ...]) -> str:
    if not epochs:
        return "-"
    if list(epochs) == list(range(epochs[0], epochs[-1] + 1)):
        return str(epochs[0]) if len(epochs) == 1 else f"{epochs[0]}-{epochs[-1]}"
    return ",".join(map(str, epochs))


def _kept(task: TaskPlan) -> str:
    """The epochs up to the task's frontier that it keeps as they are (a stateless task may redo
    some of them for a windowed reader)."""
    kept = tuple(e for e in range(1, task.kept_through + 1) if e not in task.rerun)
    return _span(kept) if kept else "none"
