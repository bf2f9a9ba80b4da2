"""The watcher: notices a lost worker by itself and starts what it needs, without a person.

``falkirk watch --dag D ...`` runs beside the scheduler. Every ``--poll`` seconds it pings the
Celery workers (Celery's own heartbeat, a broadcast over the broker); a worker that stays silent
for longer than ``--timeout`` seconds is lost (:class:`~falkirk.policies.liveness.Heartbeats`),
and for each watched DAG:

* its process pairs on that worker are taken over (:func:`falkirk.plugins.pairs.take_over`):
  the twins hold the partitions, nothing re-runs;
* the plan for the lost worker (``falkirk plan --lost-worker``) is recorded, so the Falkirk
  view shows it; a DAG that opts in with the tag ``falkirk:auto_recover`` has it replayed
  at once, as ``falkirk replay`` would.

So a lost worker costs the paired tasks the time to notice it (at most ``--timeout`` plus one
poll) and the others their re-runs. Replays run beside the watch, one per DAG at a time, so a
long one never delays noticing the next loss. A response that cannot be made yet (the DAG is
being recovered by another plan, the store or Airflow does not answer, the ledger moved while
planning) is tried again every ``RETRY_SECONDS`` until it is made. A lost worker that answers
again (a new machine under its name) is watched as any other: lost again, it is responded to
again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from falkirk.plugins.airflow_rest import api_path
from falkirk.policies.liveness import Heartbeats

AUTO_RECOVER_TAG = "falkirk:auto_recover"
RETRY_SECONDS = 30.0  # between two attempts at a response that could not be made


def celery_ping(timeout: float = 2.0) -> list[str]:
    """The workers that answer a Celery ping now, by name (``name@host`` -> ``name``)."""
    from airflow.providers.celery.executors.celery_executor_utils import app

    replies = app.control.ping(timeout=timeout) or []
    return sorted({host.split("@", 1)[0] for reply in replies for host in reply})


def watch(dags: Sequence[str], store: Any, client: Any, workers: Sequence[str], *, timeout: float = 30.0,
          poll: float = 5.0, ping: Callable[[], Iterable[str]] = celery_ping,
          progress: Callable[[str], None] = print, stop: Callable[[], bool] = lambda: False,
          clock: Callable[[], float] = time.monotonic) -> None:
    """Watch ``workers`` until ``stop()``; respond to each lost one for every DAG in ``dags``."""
    beats = Heartbeats(workers, timeout, started=clock())
    progress(f"falkirk watch: {', '.join(workers)} (lost after {timeout:.0f}s of silence), for {', '.join(dags)}")
    pending: dict[tuple[str, str], float] = {}  # (DAG, lost worker) -> when to try responding (again)
    replays: dict[str, threading.Thread] = {}  # DAG -> its replay under way
    stopped_short: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()  # replays that did not finish
    while not stop():
        try:
            beats.heard(ping(), clock())
        except Exception as exc:  # noqa: BLE001 - the broker may blink; silence is judged by the timeout
            progress(f"falkirk watch: ping failed ({type(exc).__name__}: {exc})")
        while not stopped_short.empty():
            pending.setdefault(stopped_short.get(), clock() + RETRY_SECONDS)
        for worker in beats.lost(clock()):
            progress(f"falkirk watch: worker {worker} has not answered for more than {timeout:.0f}s: lost")
            pending.update({(dag, worker): clock() for dag in dags})
        for (dag, worker), due in sorted(pending.items(), key=lambda item: item[1]):
            if due > clock() or (dag in replays and replays[dag].is_alive()):
                continue  # not yet; or its replay still runs: the next plan is made once it ended
            try:
                plan_id = respond(dag, worker, store, client, progress, replay=False)
            except Exception as exc:  # noqa: BLE001 - one DAG's trouble does not stop the others'
                pending[dag, worker] = clock() + RETRY_SECONDS
                progress(f"falkirk watch: {dag}: could not respond to the loss of {worker}: "
                         f"{type(exc).__name__}: {exc} (trying again in {RETRY_SECONDS:.0f}s)")
                continue
            del pending[dag, worker]
            if plan_id is not None:
                replays[dag] = threading.Thread(target=_replay, name=f"replay {dag}", daemon=True,
                                                args=(dag, plan_id, worker, store, client, progress, stopped_short))
                replays[dag].start()
        time.sleep(poll)


def _replay(dag_id: str, plan_id: str, worker: str, store: Any, client: Any, progress: Callable[[str], None],
            stopped_short: queue.SimpleQueue[tuple[str, str]]) -> None:
    """Replay ``plan_id`` (beside the watch); if it stops short, the loss is responded to again."""
    from falkirk.plugins.recovery import replay

    try:
        replay(plan_id, store, client, progress=progress)
    except Exception as exc:  # noqa: BLE001 - planned again from the ledger as it is now
        progress(f"falkirk watch: {dag_id}: could not respond to the loss of {worker}: replaying plan {plan_id} "
                 f"stopped: {type(exc).__name__}: {exc} (planning again in {RETRY_SECONDS:.0f}s)")
        stopped_short.put((dag_id, worker))


def respond(dag_id: str, worker: str, store: Any, client: Any, progress: Callable[[str], None] = print,
            replay: bool = True) -> str | None:
    """Take over ``dag_id``'s pairs on the lost ``worker`` and plan (and, opted in, replay) the
    recovery of the rest; returns the plan's id, if one was needed. ``replay=False``: a plan the
    DAG opts in to replaying is not replayed here; its id is returned only for such a plan (the
    watch replays it beside its loop)."""
    from falkirk.plugins.pairs import take_over
    from falkirk.plugins.recovery import plan
    from falkirk.plugins.recovery import replay as replay_plan
    from falkirk.policies.planning.recovery import PlanError
    from falkirk.policies.store.control import PairLayouts

    layout = PairLayouts(store).load(dag_id)
    if layout is not None and layout.on(worker):
        take_over(dag_id, store, client, worker=worker, reason=f"no heartbeat from {worker}", progress=progress)
    try:
        recovery = plan(dag_id, store, client, lost_workers=[worker])
    except PlanError as exc:
        if "changes nothing" in str(exc):  # the worker held no scratch data of this DAG
            return None
        raise
    if not recovery.rerun_set():
        return recovery.plan_id if replay else None
    if AUTO_RECOVER_TAG in {t.get("name") for t in client.request("GET", api_path("dags", dag_id)).get("tags", [])}:
        progress(f"{dag_id}: replaying plan {recovery.plan_id} for the lost worker {worker} ({AUTO_RECOVER_TAG})")
        if not replay:
            return recovery.plan_id
        replay_plan(recovery.plan_id, store, client, progress=progress)
    else:
        progress(f"{dag_id}: plan {recovery.plan_id} for the lost worker {worker} is recorded; preview and replay it "
                 f"in the Falkirk view, or: falkirk replay {recovery.plan_id}")
        if not replay:
            return None
    return recovery.plan_id


__all__ = ["AUTO_RECOVER_TAG", "celery_ping", "respond", "watch"]
