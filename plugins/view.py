"""The Falkirk view's data: what the UI shows for one DAG, built from the serialized DAG,
the ledger, Airflow's task instances and the recovery log.

These functions take plain values (task lists, ledger rows, log rows) and return JSON-ready
dicts, so the API routes stay thin and the shapes can be tested without a server.

>>> from falkirk.plugins.grid_status import CheckpointGrid
>>> tasks = [DagTask("clean", "batch(log_outputs=true)", ("source",)), DagTask("source", "ephemeral", ())]
>>> grid = CheckpointGrid({"source": "SS", "clean": "L-"}, {1: "epoch-1", 2: "epoch-2"}, 2)
>>> view = dag_view("d", tasks, grid, {("clean", "epoch-2"): "failed"}, [], "/scratch", 3, can_replay=False)
>>> [t["task_id"] for t in view["tasks"]], view["failed"]
(['source', 'clean'], [{'task_id': 'clean', 'epoch': 2, 'run_id': 'epoch-2'}])
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from falkirk.plugins.grid_status import CheckpointGrid, CheckpointStatus
from falkirk.policies.ids import ProcessorId, ReplicaId
from falkirk.policies.partitions import processors
from falkirk.policies.planning.recovery import RecoveryPlan
from falkirk.policies.planning.recovery_log import GC_PREFIX, lease_seconds
from falkirk.policies.regimes import Regime, RegimeError

# Airflow task-instance states worth showing over a cell; "success" is what the ledger shows.
LIVE_STATES = ("failed", "upstream_failed", "running", "queued", "scheduled", "up_for_retry", "restarting", "cleared")

# A cell Airflow reports successful but whose ledger row is missing (see dag_view).
UNRECORDED = "success without ledger row"
UNRECORDED_WHY = ("Airflow reports success but the ledger has no row: a ledger commit was lost, or the "
                  "instance was marked successful by hand; it must run again")


@dataclass(frozen=True)
class DagTask:
    """A task as the view draws it: its id, regime text (``None`` for a plain Airflow task),
    upstream tasks, and the text of its epoch clock."""

    task_id: str
    regime: str | None
    upstream: tuple[str, ...]
    epoch_clock: str | None = None
    # A partitioned task's partition count (None: not partitioned).
    partitions: int | None = None
    # Whether its asset events carry its epoch's partition key (the operator's partition_outlets).
    partition_outlets: bool = False

    @property
    def replicas(self) -> int:
        """Replicas per partition: 2 under process pairs (task instances 2p and 2p+1), else 1."""
        return Regime.parse(self.regime).replicas if self.regime else 1

    @property
    def regime_name(self) -> str | None:
        if self.regime is None:
            return None
        try:
            return Regime.parse(self.regime).name
        except RegimeError:
            return None


def topological(tasks: Iterable[DagTask]) -> list[DagTask]:
    """``tasks`` with every task after its upstream tasks; ties in name order (a stable layout)."""
    by_id = {t.task_id: t for t in tasks}
    placed: dict[str, DagTask] = {}
    while len(placed) < len(by_id):
        ready = sorted(t for t, task in by_id.items() if t not in placed
                       and all(u in placed or u not in by_id for u in task.upstream))
        if not ready:  # a cycle cannot come from Airflow; keep the rest in name order
            ready = sorted(set(by_id) - set(placed))
        for t in ready:
            placed[t] = by_id[t]
    return list(placed.values())


def dag_view(
    dag_id: str,
    tasks: Sequence[DagTask],
    grid: CheckpointGrid,
    live_states: Mapping[tuple[ProcessorId, str], str | None],
    recovery_events: Sequence[Mapping[str, Any]],
    scratch_uri: str,
    ledger_version: int | None,
    can_replay: bool,
    unrecorded: Sequence[tuple[str, int, str]] = (),
    workers: Sequence[str] = (),
    progress: Mapping[str, Mapping[int, str]] | None = None,
) -> dict[str, Any]:
    """Everything the view shows at load (see ``GET /api/v1/dags/{dag_id}/view``).

    ``live_states`` maps (task, run id) to Airflow's state for the instances that are not
    plainly successful; failed ones become the preselected failures. ``unrecorded`` holds the
    (task, epoch, run id) Airflow reports successful without a ledger row
    (:func:`falkirk.plugins.grid_status.unrecorded`): they are shown as such and preselected too.
    ``workers``: the workers the ledger says hold some of the DAG's scratch tables (the choices
    of a lost worker). ``progress``: per row and epoch without a committed checkpoint, how far
    its latest attempt got inside the epoch (:func:`epoch_progress`).
    """
    ordered = topological(tasks)
    # The grid's rows: a task, or each partition of a partitioned one (falkirk.policies.partitions).
    rows: list[dict[str, Any]] = [{"row_id": p, "task_id": t.task_id,
             "partition": p.map_index // t.replicas if t.partitions else None,
             "replica": str(ReplicaId.of(task=t.task_id, map_index=p.map_index)) if t.replicas > 1 else None}
            for t in ordered for p in processors(t.task_id, t.partitions, t.replicas)]
    ids: list[ProcessorId] = [r["row_id"] for r in rows]
    task_ids = [t.task_id for t in ordered]
    runs, last = grid.runs, grid.last_epoch
    epoch_of = {run: epoch for epoch, run in runs.items()}
    overlay: dict[str, dict[str, str]] = {}
    for (task, run), state in live_states.items():
        if task in ids and run in epoch_of and (state or "cleared") in LIVE_STATES:
            overlay.setdefault(task, {})[str(epoch_of[run])] = state or "cleared"
    failed = [{"task_id": t, "epoch": epoch_of[r], "run_id": r} for (t, r), s in live_states.items()
              if s == "failed" and t in ids and r in epoch_of]
    for name, epoch, run in unrecorded:
        if name in ids:
            overlay.setdefault(name, {})[str(epoch)] = UNRECORDED
            failed.append({"task_id": name, "epoch": epoch, "run_id": run, "why": UNRECORDED_WHY})
    failed.sort(key=lambda f: (f["epoch"], f["task_id"]))
    scratch = f"{scratch_uri.rstrip('/')}/{dag_id}"
    return {
        "dag_id": dag_id,
        "tasks": [{"task_id": t.task_id, "regime": t.regime, "regime_name": t.regime_name,
                   "partitions": t.partitions, "upstream": [u for u in t.upstream if u in task_ids]} for t in ordered],
        "rows": rows,
        "first_epoch": 1,
        "last_epoch": last,
        "epochs": [{"epoch": e, "run_id": runs[e]} for e in sorted(runs)],
        "status": {t: grid.status.get(t, CheckpointStatus.MISSING.code * last) for t in ids},
        "statuses": [{"code": s.code, "label": s.label, "name": s.name.lower()} for s in CheckpointStatus],
        "airflow_states": overlay,
        "failed": failed,
        "scratch_locations": [scratch] + [f"{scratch}/{t.task_id}" for t in ordered] + [
            f"{scratch}/{t.task_id}/partition-{i}" for t in ordered for i in range(t.partitions or 0)],
        "workers": sorted(set(workers)),
        "progress": {t: {str(e): text for e, text in sorted(by_epoch.items())
                         if 1 <= e <= last and grid.status.get(t, "")[e - 1:e] in ("-", "I", "")}
                     for t, by_epoch in (progress or {}).items() if t in ids},
        "ledger_version": ledger_version,
        "can_replay": can_replay,
        "recoveries": recovery_history(recovery_events),
    }


def plan_view(plan: RecoveryPlan) -> dict[str, Any]:
    """A plan as the preview shows it: per task, its frontier and re-runs, and both re-run sets."""
    rerun, clear = plan.rerun_set(), plan.clear_downstream_set()
    return {
        "plan_id": plan.plan_id,
        "dag_id": plan.dag_id,
        "ledger_version": plan.ledger_version,
        "failures": [f.describe() for f in plan.failures],
        "last_epoch": plan.last_epoch,
        "tasks": [{"task_id": t.task_id, "regime": t.regime, "frontier": t.kept_through, "rerun": list(t.rerun),
                   "restores": (f"state of epoch {t.restore_from.epoch} ({t.restore_from.tier})"
                                if t.restore_from else None),
                   "clear_downstream": list(t.clear_downstream)} for t in plan.tasks],
        "rerun": sorted([t, e] for t, e in rerun),
        "clear_downstream": sorted([t, e] for t, e in clear),
        "rerun_count": len(rerun),
        "clear_downstream_count": len(clear),
        # re-runs clear-downstream would not make: with any, it cannot recover at all
        "clear_downstream_misses": sorted([t, e] for t, e in plan.clear_downstream_misses()),
        "clear_downstream_verdict": plan.clear_downstream_verdict(),
        "table": plan.table(),
    }


def recovery_history(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per plan that was executed or attempted, newest first: who ran it, when, the outcome,
    the (task, epoch) pairs it re-runs (the grid marks those of the latest finished recovery), and
    for a recovery across DAGs the other DAGs' plans (``across``).

    Plans that were only previewed or planned and never started are left out.
    """
    plans: dict[str, dict[str, Any]] = {}
    seen: dict[str, Any] = {}  # plan -> when its executor last showed life (started, resumed, heartbeat)
    for r in events:
        if r["plan_id"].startswith(GC_PREFIX):  # a garbage collection's lease, not a recovery
            continue
        p = plans.setdefault(r["plan_id"], {"plan_id": r["plan_id"], "failures": [], "rerun_count": None,
                                            "rerun": [], "clear_downstream_count": None, "by": None,
                                            "started_at": None,
                                            "ended_at": None, "outcome": None, "detail": "", "resumptions": 0,
                                            "across": []})
        at = r["recorded_at"].isoformat() if hasattr(r["recorded_at"], "isoformat") else str(r["recorded_at"])
        if r["event"] == "planned":
            plan = RecoveryPlan.from_json(json.loads(r["detail"]))
            p.update(failures=[f.describe() for f in plan.failures], rerun_count=len(plan.rerun_set()),
                     rerun=sorted([t, e] for t, e in plan.rerun_set()),
                     clear_downstream_count=len(plan.clear_downstream_set()))
        if r["event"] == "across":  # one recovery across DAGs: the other DAGs' plans
            p["across"] = [{"dag_id": d, "plan_id": i} for d, i in json.loads(r["detail"])["plans"]
                           if i != r["plan_id"]]
        if r["event"] in ("started", "resumed", "heartbeat"):
            seen[r["plan_id"]] = r["recorded_at"]
        if r["event"] == "started":
            p.update(by=r["holder"], started_at=at, outcome="running", ended_at=None, detail="")
        elif r["event"] == "resumed":  # the same recovery, continued by another executor
            p.update(by=r["holder"], outcome="running", ended_at=None, resumptions=p["resumptions"] + 1,
                     started_at=p["started_at"] or at)
        elif r["event"] in ("finished", "failed"):
            p.update(ended_at=at, outcome=r["event"], detail=r["detail"])
        elif r["event"] in ("released", "expired"):
            p.update(ended_at=at, outcome=r["event"], detail=_note(r["detail"]))
    now, seconds = datetime.now(UTC), lease_seconds()
    for plan_id, p in plans.items():
        last = seen.get(plan_id)
        if p["outcome"] != "running" or not isinstance(last, datetime):
            continue
        last = last if last.tzinfo else last.replace(tzinfo=UTC)
        expires = last + timedelta(seconds=seconds)
        p["expires_at"] = expires.isoformat()
        if expires < now:  # its executor died: the next recovery of the DAG takes the lease over
            p.update(outcome="expired", detail=f"the lease was not renewed since {last.isoformat()}; the next "
                                               f"recovery of the DAG takes it over (or resumes this plan)")
    started = [p for p in plans.values() if p["started_at"]]
    return sorted(started, key=lambda p: p["started_at"], reverse=True)


def _note(detail: str) -> str:
    try:
        return str(json.loads(detail).get("note", detail))
    except (ValueError, AttributeError):
        return detail


__all__ = ["DagTask", "dag_view", "plan_view", "recovery_history", "topological"]


def epoch_progress(checkpoints: Iterable[Any]) -> dict[str, dict[int, str]]:
    """Per processor and epoch, its latest step checkpoint as people read it (``iteration 20 of 30``),
    from :class:`~falkirk.policies.store.steps.StepCheckpoint` objects: the newest incarnation's furthest step.

    >>> from falkirk.policies.store.steps import StepCheckpoint
    >>> cp = lambda step, inc=0: StepCheckpoint(dag_id="d", task_id="rank", map_index=-1, epoch=7, incarnation=inc, kind="iteration", step=step, of=30, uri="/t", tier="durable", version=0, rows=1)
    >>> epoch_progress([cp(10), cp(20), cp(5, inc=1)])
    {'rank': {7: 'iteration 5 of 30'}}
    """
    latest: dict[tuple[ProcessorId, int], Any] = {}
    for c in checkpoints:
        key = (c.processor, c.epoch)
        if key not in latest or (c.incarnation, c.step) > (latest[key].incarnation, latest[key].step):
            latest[key] = c
    out: dict[str, dict[int, str]] = {}
    for (processor, epoch), c in sorted(latest.items()):
        out.setdefault(processor, {})[epoch] = c.progress
    return out

