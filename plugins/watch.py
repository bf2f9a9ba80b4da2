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
poll) and the others their re-runs.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Sequence

from falkirk.policies.liveness import Heartbeats

AUTO_RECOVER_TAG = "falkirk:auto_recover"


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
    while not stop():
        try:
            beats.heard(ping(), clock())
        except Exception as exc:  # noqa: BLE001 - the broker may blink; silence is judged by the timeout
            progress(f"falkirk watch: ping failed ({type(exc).__name__}: {exc})")
        for worker in beats.lost(clock()):
            progress(f"falkirk watch: worker {worker} has not answered for more than {timeout:.0f}s: lost")
            for dag in dags:
                try:
                    respond(dag, worker, store, client, progress)
                except Exception as exc:  # noqa: BLE001 - one DAG's trouble does not stop the others'
                    progress(f"falkirk watch: {dag}: could not respond to the loss of {worker}: "
                             f"{type(exc).__name__}: {exc}")
        time.sleep(poll)


def respond(dag_id: str, worker: str, store: Any, client: Any, progress: Callable[[str], None] = print) -> str | None:
    """Take over ``dag_id``'s pairs on the lost ``worker`` and plan (and, opted in, replay) the
    recovery of the rest; returns the plan's id, if one was needed."""
    from falkirk.plugins.pairs import take_over
    from falkirk.plugins.recovery import plan, replay
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
        return recovery.plan_id
    if AUTO_RECOVER_TAG in {t.get("name") for t in client.request("GET", f"/api/v2/dags/{dag_id}").get("tags", [])}:
        progress(f"{dag_id}: replaying plan {recovery.plan_id} for the lost worker {worker} ({AUTO_RECOVER_TAG})")
        replay(recovery.plan_id, store, client, progress=progress)
    else:
        progress(f"{dag_id}: plan {recovery.plan_id} for the lost worker {worker} is recorded; preview and replay it "
                 f"in the Falkirk view, or: falkirk replay {recovery.plan_id}")
    return recovery.plan_id


__all__ = ["AUTO_RECOVER_TAG", "celery_ping", "respond", "watch"]
