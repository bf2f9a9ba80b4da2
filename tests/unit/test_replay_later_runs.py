"""A whole replay, with later DAG runs arriving, under seeded interleavings of a scheduler, killed
tasks and a killed replay, against a brute-force check that the end state equals the
failure-free run's.

The replay's own executor runs (:func:`falkirk.plugins.recovery._sweep_later_rows`, ``_to_clear``,
``_clear`` and :meth:`RunningReplay.wait`, with the decisions of
``falkirk.policies.planning.replay_decisions``); what it reads and writes is an in-memory model
(``World``) of Airflow, the ledger with its rollbacks and the completions log, since a scheduler
cannot be paused between two REST calls. Before answering each read or write, the model lets the
scheduler take a few random steps.

The model's jobs behave as the runtime does: a job reads its inputs' current rows when it starts
(the upstream task's epoch, and a stateful task's own previous epoch); it refuses to commit if one
of them was rolled back meanwhile; its row records the rollbacks' version it checked; a re-run of a
committed and completed epoch is refused. Each row is *correct* if it was computed from correct
rows and, for the epoch with the bad input, after the rollback.

Each seed draws the bad epoch (its re-run set as a plan computes it), how far the two later DAG
runs got before the rollback, when the replay is killed and which instances are killed. The
replay is resumed, as a user would, whenever it stops. At the end every instance of every epoch
must have succeeded with a current, correct row, no re-run may have been refused, and nothing
before the bad epoch may have run again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from falkirk.plugins import recovery
from falkirk.plugins.airflow_rest import AirflowError
from falkirk.plugins.recovery import RunningReplay, _clear, _sweep_later_rows, _to_clear
from falkirk.policies.ids import CommitId, ProcessorId
from falkirk.policies.planning.replay_decisions import affected_later

from .replay_scheduler import STATEFUL, TASKS, Scheduler

DOWNSTREAM = {"source": ("model", "sink"), "model": ("sink",), "sink": ()}
UPSTREAM = {"source": {"source"}, "model": {"source", "model"}, "sink": {"source", "model", "sink"}}
LAST = 5  # the plan's last epoch
EPOCHS = range(1, LAST + 3)  # two later DAG runs arrive while the replay runs
DAG, PLAN = "pipe", "p"
NEVER = 10**9
STAMP = datetime(2026, 1, 1, tzinfo=timezone.utc)


class ReplayKilled(Exception):
    """The replay's process dies (SIGKILL) in the middle of its work."""


@dataclass
class Row:
    """A ledger row as the replay reads it."""

    processor: str
    epoch: int
    incarnation: int
    rollbacks_seen: int
    correct: bool
    committed_at: datetime = STAMP
    dag_id: str = DAG

    @property
    def task_id(self) -> str:
        return self.processor

    @property
    def run_id(self) -> str:
        return f"epoch-{self.epoch}"

    @property
    def key(self) -> tuple[str, int]:
        return self.processor, self.epoch

    @property
    def commit_id(self) -> CommitId:
        return CommitId(dag=self.dag_id, processor=ProcessorId.parse(self.processor), epoch=self.epoch,
                        incarnation=self.incarnation)


@dataclass
class World(Scheduler):
    """Airflow's task instances, the ledger, its rollbacks and the completions log of one DAG."""

    rng: random.Random
    bad: tuple[str, int]  # the epoch whose input was wrong
    state: dict[tuple[str, int], str | None] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)  # every row ever appended
    gone: set[tuple[str, int, int]] = field(default_factory=set)  # rolled back: (task, epoch, incarnation)
    records: list[tuple[str, int, str, int]] = field(default_factory=list)  # (task, epoch, plan id, version)
    version: int = -1  # the rollbacks table's version
    completed: set[tuple[str, int, int]] = field(default_factory=set)
    reading: dict[tuple[str, int], tuple[Row, ...]] = field(default_factory=dict)  # a running job's inputs
    committed_attempt: set[tuple[str, int]] = field(default_factory=set)
    kills: set[tuple[str, int]] = field(default_factory=set)
    refused: list[tuple[str, int]] = field(default_factory=list)
    commits_after: dict[tuple[str, int], int] = field(default_factory=dict)  # commits after the rollback
    rolled_back: bool = False
    killed_after: int = NEVER  # the replay dies at the write after this many

    def __post_init__(self) -> None:
        for key in ((t, e) for e in EPOCHS for t in TASKS):
            self.state[key] = "success" if key[1] <= LAST else None
        for e in range(1, LAST + 1):  # the failure-free run through the plan's last epoch
            for t in TASKS:
                inputs = self._inputs(t, e)
                self._append(t, e, correct=(t, e) != self.bad and all(r.correct for r in inputs))
                self.completed.add((t, e, 0))

    # -- the ledger --------------------------------------------------------------------------

    def current(self, key: tuple[str, int]) -> Row | None:
        rows = [r for r in self.rows if r.key == key and (*key, r.incarnation) not in self.gone]
        return max(rows, key=lambda r: r.incarnation, default=None)

    def _inputs(self, task: str, epoch: int) -> list[Row | None]:
        keys = [(TASKS[TASKS.index(task) - 1], epoch)] if task != TASKS[0] else []
        if task in STATEFUL and epoch > 1:
            keys.append((task, epoch - 1))
        return [self.current(k) for k in keys]

    def _append(self, task: str, epoch: int, correct: bool) -> Row:
        incarnation = 1 + max((i for t, e, i in self.gone if (t, e) == (task, epoch)), default=-1)
        row = Row(task, epoch, incarnation, self.version, correct)
        self.rows.append(row)
        if self.rolled_back:
            self.commits_after[task, epoch] = self.commits_after.get((task, epoch), 0) + 1
        return row

    def invalidate(self, rows: list[Row], plan_id: str = PLAN) -> int:
        new = {(r.processor, r.epoch, r.incarnation) for r in rows} - self.gone
        if new:
            self.gone |= new
            self.version += 1
            self.records += [(t, e, plan_id, self.version) for t, e, _ in sorted(new)]
        return len(new)

    # -- the jobs ----------------------------------------------------------------------------

    def _start(self, key: tuple[str, int]) -> None:
        """The job starts and reads its inputs' current rows (a snapshot)."""
        self.state[key] = "running"
        self.reading[key] = tuple(self._inputs(*key))

    def _run(self, key: tuple[str, int]) -> None:
        """One step of a running job: commit, then complete and succeed; or die, or refuse."""
        inputs = self.reading[key]
        if key in self.kills and self.rng.random() < 0.5:
            self.kills.discard(key)  # SIGKILLed; the scheduler fails it
            self.committed_attempt.discard(key)
            self.state[key] = "failed"
        elif key not in self.committed_attempt:
            mine = self.current(key)
            if mine is not None and (*key, mine.incarnation) in self.completed:
                self.refused.append(key)  # a re-run of a completed epoch
                self.state[key] = "failed"
            elif mine is not None:  # a retry of an attempt that died after its commit: finds it
                self.committed_attempt.add(key)
            elif any(r is None or (r.processor, r.epoch, r.incarnation) in self.gone for r in inputs):
                self.state[key] = "failed"  # an input missing or rolled back since it was read
            else:
                correct = all(r.correct for r in inputs) and (key != self.bad or self.rolled_back)
                self._append(*key, correct=correct)
                self.committed_attempt.add(key)
        else:
            self.committed_attempt.discard(key)
            row = self.current(key)
            if row is not None:
                self.completed.add((*key, row.incarnation))
            self.state[key] = "success"

    def _write(self) -> None:
        self.advance()
        if self.killed_after <= 0:
            raise ReplayKilled
        self.killed_after -= 1

    # -- Airflow's REST API, as the replay calls it -------------------------------------------

    def on_poll(self) -> None:
        self.advance()

    def active_runs(self, dag_id: str) -> list[dict]:
        return []  # no max_active_runs here: slots are tested on their own

    def clear(self, dag_id: str, run_id: str, task_ids: list[str], dry_run: bool = False) -> list:
        self._write()
        epoch = int(run_id.split("-")[1])
        for task in task_ids:
            self.committed_attempt.discard((task, epoch))
            self.state[(task, epoch)] = None
        return []

    def produced_assets(self, dag_id: str, task_id: str) -> list[dict]:
        return []  # no task of this DAG names an Asset as an outlet

    def set_state(self, dag_id: str, run_id: str, task_id: str, state: str, note: str | None = None) -> None:
        self._write()
        self.state[(task_id, int(run_id.split("-")[1]))] = state

    # -- the ledger, its rollbacks and completions, as the replay reads them -------------------

    def entries(self, dag_id: str, include_invalidated: bool = False) -> list[Row]:
        self.advance()
        if include_invalidated:
            return list(self.rows)
        return sorted(filter(None, (self.current(k) for k in self.state)), key=lambda r: (r.epoch, r.processor))

    def entries_and_invalidated(self, dag_id: str) -> tuple[list[Row], list[Row]]:
        current = self.entries(dag_id)
        return current, [r for r in self.rows if r not in current]

    def completed_among(self, rows: list[Row]) -> list[Row]:
        self.advance()
        return [r for r in rows if (r.processor, r.epoch, r.incarnation) in self.completed]

    @property
    def invalidations(self) -> SimpleNamespace:
        def record(rows: list[Row], plan_id: str) -> int:
            self._write()
            return self.invalidate(rows, plan_id)

        def rolled_back_by(dag_id: str, plan_id: str) -> list[tuple[str, int, int, int]]:
            return [(t, -1, e, v) for t, e, p, v in self.records if p == plan_id or p.startswith(plan_id + "+later:")]

        return SimpleNamespace(recorded_at=lambda dag_id, plan_id: STAMP, record=record, rolled_back_by=rolled_back_by)


def _rerun_set(bad: tuple[str, int]) -> set[tuple[str, int]]:
    """What a plan re-runs for a bad epoch of one task: it and everything downstream of it, and
    the later epochs, through the plan's last, of the stateful tasks among them."""
    task, epoch = bad
    below = TASKS[TASKS.index(task):]
    return {(t, e) for t in below for e in range(1, LAST + 1) if e == epoch or (e > epoch and t in STATEFUL)}


class Replay(RunningReplay):
    """The replay between its steps, without a lease (renewal and leases are tested elsewhere)."""

    def renew(self) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass


def _replay(world: World, rerun: set[tuple[str, int]], monkeypatch: pytest.MonkeyPatch) -> int:
    """Roll back, then run the replay's executor (sweep, clear, wait, later runs), resumed until it
    finishes; returns how often it was resumed."""
    redone = {t for t, _ in rerun}
    monkeypatch.setattr(recovery, "Completions", lambda store: world)
    monkeypatch.setattr(recovery, "taken_over_replicas", lambda store, dag_id: set())  # no process pairs here
    monkeypatch.setattr(recovery, "Ledger", lambda store: world)
    monkeypatch.setattr(recovery, "_affected_later", lambda running, ledger: affected_later(DOWNSTREAM, redone,
                                                                                             STATEFUL))
    monkeypatch.setattr(recovery, "_upstream", lambda running, ledger: UPSTREAM)
    monkeypatch.setattr(recovery, "_settle_second_runs", lambda running, progress: None)  # no Assets here
    plan = SimpleNamespace(dag_id=DAG, plan_id=PLAN, failures=(), last_epoch=LAST, rerun_set=lambda: set(rerun))
    log = SimpleNamespace(end=lambda *a, **k: None)
    # The plan's rollback, recorded once before anything is cleared.
    world.invalidate([world.current(k) for k in rerun])
    world.rolled_back = True
    resumes = 0
    while True:
        running = Replay(plan, log, SimpleNamespace(resumed=resumes > 0), world,
                         {e: f"epoch-{e}" for e in range(1, LAST + 1)}, {}, 0, 0.0, store="store")
        try:
            _sweep_later_rows(running, world, progress=lambda *_: None)
            _clear(running, _to_clear(running, world, lambda *_: None), progress=lambda *_: None)
            running.wait(progress=lambda *_: None, timeout=2, poll=0)
            return resumes
        except ReplayKilled:
            world.killed_after = NEVER  # the executor that resumes is not killed
            world.advance(8)
        except AirflowError:  # an instance it waited for failed: resumed once it has
            world.advance(8)
        resumes += 1
        assert resumes <= 12, f"the replay does not converge: {world.state}"


@pytest.mark.parametrize("seed", range(300))
def test_a_replay_with_later_runs_arriving_ends_in_the_failure_free_state(seed: int, monkeypatch) -> None:
    rng = random.Random(seed)
    bad = (rng.choice(TASKS), rng.randint(1, LAST))
    world = World(rng, bad)
    rerun = _rerun_set(bad)
    for _ in range(rng.randint(0, 20)):  # the later runs start before the rollback, some commit
        world.step()
    world.killed_after = rng.choice([0, 1, 2, 4, NEVER])
    world.kills = set(rng.sample(sorted(rerun), k=min(len(rerun), rng.randint(0, 2))))
    _replay(world, rerun, monkeypatch)
    while world.step():  # what the scheduler does after the replay ended
        pass

    assert world.refused == []  # no instance was cleared after it had re-run and completed
    rows = {k: world.current(k) for k in world.state}
    wrong = sorted(k for k, r in rows.items() if r is None or not r.correct)
    assert wrong == [], f"instances without a correct current row: {wrong}"
    assert all(s == "success" for s in world.state.values()), world.state
    assert all(world.commits_after.get(k, 0) == 1 for k in rerun)  # each re-run redone exactly once
    untouched = {(t, e) for t in TASKS for e in range(1, LAST + 1)} - rerun
    assert not any(world.commits_after.get(k) for k in untouched)  # nothing else through the last epoch re-ran
