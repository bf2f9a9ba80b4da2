"""Recovery across DAGs joined by Airflow Assets: one plan for a producer DAG and every DAG
that read what it redoes, replayed producers first.

:func:`plan_across` plans the producer DAG as :func:`falkirk.plugins.recovery.plan` does, then
reads, from the consumers' ledger rows, which of their runs consumed an epoch the plan redoes
(their recorded asset inputs: :func:`falkirk.policies.planning.assets.asset_edges`), and plans
each consumer DAG from those runs (:func:`falkirk.policies.planning.assets.plan_across_dags`).
Each DAG's plan is recorded in the recovery log under its own id, as any plan is.

:func:`replay_across` replays them in that order, one DAG after the other, so a consumer's
re-runs start only once its producer's redone epochs are committed (a consumer run reads the
incarnation its producer's ledger names when it runs). Between two DAGs it also settles the
runs Airflow starts on its own: each redone producer epoch emits its asset event again, and a
consumer scheduled with ``PartitionedAssetTimetable`` gets a second run of that epoch. That
run's job refuses it while the epoch it would redo is still built on the replaced read (a
re-run of one task instance cannot redo the epochs built on it); once the consumer's own
replay has redone the epoch, the refused run is marked success, its note naming the plan and
the run that did the work. A second run that starts after the redo finds its events already
read, and succeeds doing nothing.

Example::

    client = AirflowClient("http://127.0.0.1:8080", "admin", "admin")
    across = plan_across("falkirk_orders", store, client, bad_epochs=[("ingest", 3)])
    print(across.table())       # one plan per DAG touched, producers first
    replay_across([p.plan_id for p in across.plans], store, client, holder="admin")
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from falkirk.plugins.airflow_rest import AirflowClient, AirflowError, api_path
from falkirk.plugins.dag_facts import regimes_and_clock
from falkirk.plugins.recovery import Progress, ReplayReport, check_may_clear, plan, replay, run_ids
from falkirk.policies.asset_events import run_date
from falkirk.policies.epochs import EpochClock, EpochError
from falkirk.policies.ids import ProcessorId
from falkirk.policies.planning.assets import AssetEdge, CrossDagPlan, asset_edges, plan_across_dags
from falkirk.policies.planning.from_ledger import compute_plan
from falkirk.policies.planning.recovery import Failure, PlanError, RecoveryPlan
from falkirk.policies.planning.recovery_log import AlreadyReplayed, RecoveryLog, check_not_finished
from falkirk.policies.regimes import Regime
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger

FINISHED = ("success", "failed")
# How long a replay waits, after a producer DAG's redo, for the consumer runs Airflow starts on
# the replacement events to appear and end, before it replays the consumer regardless.
SECOND_RUNS_SECONDS = 180.0


def plan_across(dag_id: str, store: StoreConfig, client: AirflowClient | None = None, *, record: bool = True,
                **failures: Any) -> CrossDagPlan:
    """The plan for the failures named in ``dag_id`` (``failures``: the keyword arguments of
    :func:`falkirk.plugins.recovery.plan`) and, through asset edges, for every DAG whose
    checkpoints read an epoch that plan redoes, producers first."""
    producer = plan(dag_id, store, client, record=record, **failures)
    across = with_consumers(producer, store, lambda dag: regimes_and_clock(dag, client)[0] if client is not None else {},
                            record=record)
    if record and len(across.plans) > 1:
        RecoveryLog(store).link(across.plans)  # each DAG's history names the others' plans
    return across


def with_consumers(producer: RecoveryPlan, store: StoreConfig, regimes: Callable[[str], Mapping[ProcessorId, Regime]],
                   record: bool = False) -> CrossDagPlan:
    """``producer`` (a plan already made) and, through the asset edges the ledger records, the
    plans of the DAGs that read an epoch it redoes, producers first; ``regimes``: a DAG's
    regimes by processor (the tasks with no ledger row yet count too)."""
    edges = consumer_edges(store)

    def planner(dag: str, handed: Sequence[Failure]) -> RecoveryPlan:
        if dag == producer.dag_id:
            return producer
        return compute_plan(dag, store, handed, regimes(dag), record=record)

    # sorted: DAGs that do not depend on each other replay in name order, the same every time
    dags = dict.fromkeys(sorted({producer.dag_id, *(e.producer_dag for e in edges),
                                 *(e.consumer_dag for e in edges)}), planner)
    return plan_across_dags(dags, edges, {producer.dag_id: producer.failures})


def consumer_edges(store: StoreConfig) -> list[AssetEdge]:
    """Every asset edge the ledger's rows record: which runs of which DAG read which epochs of
    which producer task."""
    return asset_edges(Ledger(store).asset_reads())


@dataclass(frozen=True)
class SecondRun:
    """A consumer run Airflow started on a redone producer epoch's event, beside the run whose
    ledger row the consumer's plan redoes."""

    run_id: str
    epoch: int
    state: str | None


def replay_across(plan_ids: Sequence[str], store: StoreConfig, client: AirflowClient, holder: str | None = None,
                  progress: Progress = print, timeout: float = 3600, poll: float = 2.0,
                  second_runs_timeout: float = SECOND_RUNS_SECONDS, since: datetime | None = None,
                  ) -> list[ReplayReport]:
    """Replay the recorded plans ``plan_ids`` in order (producers first, as :func:`plan_across`
    lists them), each to its end before the next starts; see the module docstring. ``since``:
    when the first plan's replay started (default: now), from which a consumer's runs of a
    redone epoch are second runs."""
    since = since or datetime.now(UTC)
    log = RecoveryLog(store)
    plans = [log.plan(p) for p in plan_ids]
    dags = [p.dag_id for p in plans]
    if len(set(dags)) != len(dags):
        raise PlanError(f"plans {', '.join(plan_ids)}: two of them are for one DAG; give one plan per DAG")
    _check_may_clear(plans, log, store, client)
    edges = consumer_edges(store)
    reports: list[ReplayReport] = []
    for i, recovery in enumerate(plans):
        upstream = {p.dag_id: p for p in plans[:i]}
        feeding = [e for e in edges if e.consumer_dag == recovery.dag_id and e.producer_dag in upstream]
        redone = _redone_reads(feeding, upstream, recovery)
        try:
            check_not_finished(log.events(recovery.dag_id), recovery.plan_id)
        except AlreadyReplayed:
            redone = set()  # replayed by an earlier call, which settled its second runs
        if redone:
            _await_second_runs(recovery, redone, since, store, client, progress, second_runs_timeout, poll)
        # The replay ends by settling the consumer's refused second runs (settle_second_runs).
        reports.append(replay(recovery.plan_id, store, client, holder=holder, progress=progress, timeout=timeout,
                              poll=poll))
    return reports


def settle_second_runs(recovery: RecoveryPlan, store: StoreConfig, client: AirflowClient,
                       progress: Progress = print) -> None:
    """Once ``recovery`` (of a DAG that reads another through an Asset) has redone its epochs,
    mark success every refused run of those epochs that Airflow started on a redone producer
    epoch's event, also those started before this replay: on a producer's recovery replayed
    earlier, or by a replay across both DAGs that stopped after the producer's redo (then the
    consumer is planned alone, with --stale-inputs). Every replay calls it as it finishes."""
    if any(e.consumer_dag == recovery.dag_id for e in consumer_edges(store)):
        _settle_second_runs(recovery, {e for _, e in recovery.rerun_set()}, store, client, progress)


def _check_may_clear(plans: Sequence[RecoveryPlan], log: RecoveryLog, store: StoreConfig,
                     client: AirflowClient) -> None:
    """Ask Airflow, changing nothing (a dry run of each clear), whether the caller may clear
    every plan's task instances: one DAG it may not touch stops the recovery before any runs."""
    for recovery in plans:
        try:
            check_not_finished(log.events(recovery.dag_id), recovery.plan_id)
        except AlreadyReplayed:
            continue
        # epochs with no run yet (a consumer paused when its event came) get theirs in the replay
        runs = run_ids(recovery, Ledger(store).entries(recovery.dag_id, include_invalidated=True), client)
        try:
            check_may_clear(recovery, runs, client)
        except AirflowError as exc:
            raise AirflowError(f"plan {recovery.plan_id} re-runs task instances of {recovery.dag_id}, which "
                               f"Airflow does not let this user clear ({exc}); nothing was run") from None


def _redone_reads(feeding: Sequence[AssetEdge], upstream: Mapping[str, RecoveryPlan],
                  recovery: RecoveryPlan) -> set[int]:
    """The consumer epochs the plan redoes that read a producer epoch redone upstream: the ones
    Airflow starts again on a replacement event."""
    ours = {e for _, e in recovery.rerun_set()}
    found = set()
    for edge in feeding:
        reruns = {t.task_id: t.rerun for t in upstream[edge.producer_dag].tasks}
        found |= set(edge.stale_runs(reruns)) & ours
    return found


def _second_runs(recovery: RecoveryPlan, epochs: set[int], since: datetime | None, store: StoreConfig,
                 client: AirflowClient) -> list[SecondRun]:
    """The consumer's runs of ``epochs``, started ``since`` (at any time when ``None``), other
    than the ones its ledger rows name."""
    _, clock = regimes_and_clock(recovery.dag_id, client)
    named = {e.run_id for e in Ledger(store).entries(recovery.dag_id, include_invalidated=True)}
    runs = client.request("GET", api_path("dags", recovery.dag_id, "dagRuns"),
                          params={"order_by": "run_after", "limit": 1000})["dag_runs"]
    found = []
    for run in runs:
        epoch = _epoch_of(run, clock)
        started = _date(run.get("run_after"))
        fresh = since is None or started is None or started >= since
        if epoch in epochs and run["dag_run_id"] not in named and fresh:
            found.append(SecondRun(run["dag_run_id"], epoch, run.get("state")))
    return found


def _epoch_of(run: Mapping[str, Any], clock: EpochClock | None) -> int | None:
    if clock is None:
        return None
    date = run_date(_date(run.get("logical_date")), _date(run.get("partition_date")), run.get("partition_key"))
    try:
        return clock.epoch_of(date) if date is not None else None
    except EpochError:
        return None


def _date(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _await_second_runs(recovery: RecoveryPlan, epochs: set[int], since: datetime, store: StoreConfig,
                       client: AirflowClient, progress: Progress, timeout: float, poll: float) -> None:
    """Wait until each of ``epochs`` has a second run and every second run has ended (their
    jobs refuse them: the consumer's checkpoints still read the replaced incarnations)."""
    progress(f"{recovery.dag_id}: waiting for the runs Airflow starts on the redone epochs' asset events "
             f"(epochs {_span(epochs)}) before replaying plan {recovery.plan_id}")
    deadline = time.monotonic() + timeout
    while True:
        runs = _second_runs(recovery, epochs, since, store, client)
        waiting = sorted(epochs - {r.epoch for r in runs}) + sorted(r.epoch for r in runs if r.state not in FINISHED)
        if not waiting:
            return
        if time.monotonic() > deadline:
            progress(f"{recovery.dag_id}: epochs {_span(waiting)} have no second run that ended after "
                     f"{timeout:.0f}s (paused, or not scheduled with PartitionedAssetTimetable?); replaying now: a "
                     f"second run that starts after the redo does nothing")
            return
        time.sleep(poll)


def _settle_second_runs(recovery: RecoveryPlan, epochs: set[int], store: StoreConfig, client: AirflowClient,
                        progress: Progress) -> None:
    """Mark the refused second runs of ``epochs`` success: the plan redid those epochs, in the
    runs its ledger rows name, so a failed run of one of them that the ledger does not name
    is a second run its job refused."""
    redone = {e.epoch: e.run_id for e in Ledger(store).entries(recovery.dag_id)}
    for run in _second_runs(recovery, epochs, None, store, client):
        if run.state != "failed":
            continue
        note = (f"Falkirk: epoch {run.epoch} was redone by plan {recovery.plan_id} in run {redone.get(run.epoch)}, "
                f"reading the redone input; this run, started on the same asset event, was refused")
        client.set_run_state(recovery.dag_id, run.run_id, "success", note)
        progress(f"{recovery.dag_id}: run {run.run_id} (epoch {run.epoch}) marked success: {note}")


def _span(epochs: Sequence[int] | set[int]) -> str:
    return ", ".join(str(e) for e in sorted(set(epochs)))


__all__ = ["SecondRun", "consumer_edges", "plan_across", "replay_across", "settle_second_runs", "with_consumers"]
