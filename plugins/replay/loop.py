"""The replay's loop: observe, decide, act, renew, until the decision says done or stopped.

A crash anywhere (the process killed, a REST call refused, the lease lost) ends the loop; the
replay started again (by Airflow's retry of the recovery task, or by ``falkirk replay PLAN_ID``)
begins a new loop from ``Memory.fresh``, and its first pass finds in Airflow and the store what the
previous one did.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

from falkirk.plugins.airflow_rest import AirflowError
from falkirk.policies.replay import Action, AirflowView, Done, Memory, Stopped, StoreView, decide

Progress = Callable[[str], None]

_log = logging.getLogger(__name__)

# The longest wait between passes. A pass is a handful of REST reads and the ledger's new commits;
# the replay notices a re-run's end, and its last one, about half a wait late.
POLL_SECONDS = 1.0
# The shortest wait, and the share of its time the loop may spend in its passes: they run on the
# machines of the re-runs they watch, so a costly pass (a store on S3) waits longer.
MIN_POLL_SECONDS = 0.25
BUSY_SHARE = 0.2


def pause(poll: float, spent: float) -> float:
    """The wait after a pass that took ``spent`` seconds: the passes take at most
    :data:`BUSY_SHARE` of the loop's time, within [:data:`MIN_POLL_SECONDS`, ``poll``].

    >>> pause(1.0, 0.01), pause(1.0, 0.1), pause(1.0, 0.5), pause(0.1, 0.01)
    (0.25, 0.4, 1.0, 0.1)
    """
    return min(poll, max(MIN_POLL_SECONDS, spent * (1 / BUSY_SHARE - 1)))


class Observes(Protocol):
    def observe(self, memory: Memory) -> tuple[StoreView, AirflowView]: ...


class Applies(Protocol):
    def apply(self, action: Action) -> None: ...

    def renew(self) -> None: ...


def stall_seconds() -> float:
    """How long a replay waits, with no task instance changing state, on something it cannot
    change (slots held by runs it may not queue again, a failed run it may not touch)."""
    return float(os.environ.get("FALKIRK_REPLAY_STALL_SECONDS", "600"))


def reconcile(plan: Any, observer: Observes, applier: Applies, memory: Memory, progress: Progress, *,
              timeout: float = 3600, poll: float = POLL_SECONDS, until: Callable[[Memory], bool] | None = None,
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Memory:
    """Run passes of ``plan``'s replay from ``memory`` until it is done (or ``until(memory)``);
    returns the last memory. Raises :class:`AirflowError` when a pass stops (a re-run failed, or
    the replay stalled), or after ``timeout`` seconds, naming what it waits for."""
    deadline = clock() + timeout
    stall = stall_seconds()
    passes = 0
    while True:
        passes, began, pass_began = passes + 1, time.perf_counter(), clock()
        store, airflow = observer.observe(memory)
        observed = time.perf_counter()
        decision = decide(plan, store, airflow, memory, clock(), stall)
        for line in decision.lines:
            progress(line)
        for action in decision.actions:
            applier.apply(action)
        # A controller's own cost, per pass: what a slow replay spends reading against acting.
        _log.debug("plan %s: pass %d (%s): observed in %.3fs, %d actions applied in %.3fs", plan.plan_id, passes,
                   memory.stage, observed - began, len(decision.actions), time.perf_counter() - observed)
        memory, status = decision.memory, decision.status
        if isinstance(status, Done):
            return memory
        if isinstance(status, Stopped):
            raise AirflowError(status.reason)
        applier.renew()
        if until is not None and until(memory):
            return memory
        if clock() > deadline:
            raise AirflowError(f"timed out after {timeout:.0f}s with {status.done}/{status.total} task instances "
                               f"done; resume with: falkirk replay {plan.plan_id}")
        if not status.again:
            sleep(pause(poll, clock() - pass_began))
