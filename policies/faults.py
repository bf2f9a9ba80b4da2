"""Deterministic failure injection: make a job, or a replay, die at a named point.

For tests and recovery drills. The job runtime calls :func:`crash_point` between its
commits, and the replay executor between its steps; when ``FALKIRK_CRASH_AT`` names this
task, epoch and step, the process ends at once, killed by SIGKILL with no cleanup, as a
worker that loses power mid-commit would. (``after-files`` is the point between the
executors writing an epoch's data files and the driver's Delta commit that makes them
visible.) A replay's points use the task name ``replay``: ``replay:0:after-lease``,
``replay:0:after-invalidations`` and ``replay:E:after-clear`` (once epoch E is cleared).

``FALKIRK_CRASH_AT`` holds ``task_id:epoch:step`` entries separated by commas, where
``step`` is one of :data:`STEPS`; ``dag_id/task_id:epoch:step`` limits an entry to one
DAG. ``@PATH`` instead reads the entries from a file at each crash point, so a drill
can arm and disarm faults while Airflow keeps running:

>>> crash_requested("aggregate", 2, "after-outputs", "ingest:1:before-commit,aggregate:2:after-outputs")
True
>>> crash_requested("aggregate", 3, "after-outputs", "aggregate:2:after-outputs")
False
>>> crash_requested("clean", 4, "before-commit", "clicks_a/clean:4:before-commit", dag_id="clicks_b")
False
>>> crash_requested("aggregate", 2, "halfway", "aggregate:2:halfway")
Traceback (most recent call last):
...
ValueError: FALKIRK_CRASH_AT: unknown step 'halfway' in 'aggregate:2:halfway'; steps are before-commit, after-files, after-outputs, after-state, after-lease, after-invalidations, after-clear
"""

from __future__ import annotations

import os
import signal
import sys

CRASH_ENV = "FALKIRK_CRASH_AT"
STEPS = ("before-commit", "after-files", "after-outputs", "after-state",
         "after-lease", "after-invalidations", "after-clear")


def crash_requested(task_id: str, epoch: int, step: str, setting: str | None, dag_id: str | None = None) -> bool:
    """Whether ``setting`` (the value of ``FALKIRK_CRASH_AT``) asks for a crash here."""
    if setting and setting.startswith("@"):
        try:
            with open(setting[1:], encoding="utf-8") as f:
                setting = ",".join(line.strip() for line in f if line.strip())
        except FileNotFoundError:
            return False
    for entry in filter(None, (e.strip() for e in (setting or "").split(","))):
        dag, slash, entry = entry.rpartition("/") if "/" in entry.split(":")[0] else ("", "", entry)
        if slash and dag != dag_id:
            continue
        parts = entry.split(":")
        if len(parts) != 3 or not parts[1].lstrip("-").isdigit():
            raise ValueError(f"{CRASH_ENV}: {entry!r} is not task_id:epoch:step")
        if parts[2] not in STEPS:
            raise ValueError(f"{CRASH_ENV}: unknown step {parts[2]!r} in {entry!r}; steps are {', '.join(STEPS)}")
        if (parts[0], int(parts[1]), parts[2]) == (task_id, epoch, step):
            return True
    return False


def crash_point(task_id: str, epoch: int, step: str, dag_id: str | None = None) -> None:
    """End the process here if ``FALKIRK_CRASH_AT`` asks for it."""
    if crash_requested(task_id, epoch, step, os.environ.get(CRASH_ENV), dag_id):
        print(f"[falkirk] injected crash: {task_id} epoch {epoch} at {step}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
