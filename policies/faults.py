"""Deterministic failure injection: make a job, or a replay, die at a named point.

For tests and recovery drills. The job runtime calls :func:`crash_point` between its
commits, and the replay executor between its steps; when ``FALKIRK_CRASH_AT`` names this
task, epoch and step, the process ends at once, killed by SIGKILL with no cleanup, as a
worker that loses power mid-commit would. (``after-files`` is the point between the
executors writing an epoch's data files and the driver's Delta commit that makes them
visible; ``after-sink`` is between a paired task's sink write and its ledger row;
``after-completion`` is after the job recorded its epoch completed, before Airflow hears of it.) A replay's points use the task name ``replay``: ``replay:0:after-lease``,
``replay:0:after-invalidations`` and ``replay:E:after-clear`` (once epoch E is cleared); a
process pair's catch-up uses ``catch-up``: ``catch-up:E:after-copy`` (epoch E's tables copied
to the standby, its ledger row not yet written).

Inside an epoch that checkpoints step by step (:mod:`falkirk.policies.store.steps`) the
points are ``iteration-N`` (as iteration N starts), ``chunk-N`` (as chunk N starts) and
``chunk-N-after-files`` (between chunk N's data files and its commit). A task under sender-side
logs rebuilding its state has ``replayed-E`` (just after replaying input epoch E).

``FALKIRK_CRASH_AT`` holds ``task_id:epoch:step`` entries separated by commas, where
``step`` is one of :data:`STEPS` or a step point; ``dag_id/task_id:epoch:step`` limits an entry to one
DAG. ``@PATH`` instead reads the entries from a file at each crash point, so a drill
can arm and disarm faults while Airflow keeps running; an entry there ending in ``:once``
is taken out of the file as it fires, so that the retry it provokes runs through:

>>> crash_requested("aggregate", 2, "after-outputs", "ingest:1:before-commit,aggregate:2:after-outputs")
True
>>> crash_requested("aggregate", 3, "after-outputs", "aggregate:2:after-outputs")
False
>>> crash_requested("clean", 4, "before-commit", "clicks_a/clean:4:before-commit", dag_id="clicks_b")
False
>>> crash_requested("aggregate", 2, "halfway", "aggregate:2:halfway")
Traceback (most recent call last):
...
ValueError: FALKIRK_CRASH_AT: unknown step 'halfway' in 'aggregate:2:halfway'; steps are before-commit, after-files, after-outputs, after-state, after-sink, after-completion, after-lease, after-invalidations, after-clear, after-copy, iteration-N, chunk-N, chunk-N-after-files, replayed-E
>>> crash_requested("rank", 3, "iteration-7", "rank:3:iteration-7")
True
"""

from __future__ import annotations

import os
import re
import signal
import sys

CRASH_ENV = "FALKIRK_CRASH_AT"
STEPS = ("before-commit", "after-files", "after-outputs", "after-state", "after-sink", "after-completion",
         "after-lease", "after-invalidations", "after-clear", "after-copy")
STEP_POINTS = re.compile(r"(iteration|chunk|replayed)-[1-9][0-9]*|chunk-[1-9][0-9]*-after-files")


def crash_requested(task_id: str, epoch: int, step: str, setting: str | None, dag_id: str | None = None) -> bool:
    """Whether ``setting`` (the value of ``FALKIRK_CRASH_AT``) asks for a crash here."""
    path = None
    if setting and setting.startswith("@"):
        path = setting[1:]
        try:
            with open(path, encoding="utf-8") as f:
                setting = ",".join(line.strip() for line in f if line.strip())
        except FileNotFoundError:
            return False
    for raw in filter(None, (e.strip() for e in (setting or "").split(","))):
        entry = raw
        dag, slash, entry = entry.rpartition("/") if "/" in entry.split(":")[0] else ("", "", entry)
        if slash and dag != dag_id:
            continue
        parts = entry.split(":")
        once = len(parts) == 4 and parts[3] == "once"
        if once:
            parts = parts[:3]
            if path is None:
                raise ValueError(f"{CRASH_ENV}: {raw!r}: ':once' needs the entries in a file (@PATH) it can take "
                                 f"the entry out of")
        if len(parts) != 3 or not parts[1].lstrip("-").isdigit():
            raise ValueError(f"{CRASH_ENV}: {entry!r} is not task_id:epoch:step")
        if parts[2] not in STEPS and not STEP_POINTS.fullmatch(parts[2]):
            raise ValueError(f"{CRASH_ENV}: unknown step {parts[2]!r} in {entry!r}; steps are {', '.join(STEPS)}, "
                             f"iteration-N, chunk-N, chunk-N-after-files, replayed-E")
        if (parts[0], int(parts[1]), parts[2]) == (task_id, epoch, step):
            if once and path is not None:
                _take_out(path, raw)
            return True
    return False


def _take_out(path: str, entry: str) -> None:
    """Remove ``entry`` from the crash file at ``path`` (written whole, then renamed: atomic).

    Under a lock beside the file: two jobs firing at once must not each write back the file as
    they read it, restoring the other's entry (which would then fire again)."""
    import fcntl

    with open(f"{path}.lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip()]
        kept = [",".join(e for e in (x.strip() for x in line.split(",")) if e and e != entry) for line in lines]
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(f"{line}\n" for line in kept if line))
        os.replace(tmp, path)


def crash_point(task_id: str, epoch: int, step: str, dag_id: str | None = None) -> None:
    """End the process here if ``FALKIRK_CRASH_AT`` asks for it."""
    if crash_requested(task_id, epoch, step, os.environ.get(CRASH_ENV), dag_id):
        print(f"[falkirk] injected crash: {task_id} epoch {epoch} at {step}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


# --- deliberately broken recovery ----------------------------------------------------------------
# A soak must be able to fail: ``FALKIRK_BROKEN`` names recovery steps to get wrong on purpose,
# the way a plausible bug would, so that a drill shows the soak's checks catch it. Never set in
# a deployment.

BROKEN_ENV = "FALKIRK_BROKEN"
BROKEN = {
    "gc-watermark": "falkirk gc also deletes the oldest checkpoint of each state table it keeps: the one at the "
                    "low-watermark, which a recovery restores from",
}


def broken(what: str, setting: str | None = None) -> bool:
    """Whether ``FALKIRK_BROKEN`` (or ``setting``) asks to get recovery step ``what`` wrong.

    >>> broken("gc-watermark", "gc-watermark"), broken("gc-watermark", "")
    (True, False)
    >>> broken("gc-watermark", "gc")
    Traceback (most recent call last):
    ...
    ValueError: FALKIRK_BROKEN: unknown 'gc'; it names gc-watermark
    """
    names = {n.strip() for n in (os.environ.get(BROKEN_ENV, "") if setting is None else setting).split(",")} - {""}
    unknown = sorted(names - set(BROKEN))
    if unknown:
        raise ValueError(f"{BROKEN_ENV}: unknown {', '.join(map(repr, unknown))}; it names {', '.join(BROKEN)}")
    return what in names
