"""The replay's clearing decisions under seeded interleavings of a scheduler, killed tasks and a
killed replay, against a brute-force check of the end state.

The replay's own code decides (:func:`falkirk.plugins.recovery._to_clear` and ``_clear``); what
it reads and writes is an in-memory model of Airflow, the ledger and the completions log
(``World``: a scheduler cannot be paused between two REST calls, so the model stands in for
them). Before answering each read or write the model lets the scheduler take a few random
steps, so that tasks start, commit, complete and succeed between any two of the replay's reads.

Each seed draws a re-run set, when the replay is killed (after how many cleared epochs), and
which task instances are killed (before or after their commit). The replay is resumed, as a
user would, whenever it stops: killed, or ended with a failed instance. The end state must be
the failure-free run's: every re-run instance succeeded with exactly one commit after the
rollback, nothing else re-ran, and no re-run was refused as a re-run of a completed epoch
(which is what a clear of an instance that had already re-run leads to).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from falkirk.plugins import recovery
from falkirk.plugins.recovery import RunningReplay, _clear, _to_clear

from .replay_scheduler import STATEFUL, TASKS, Scheduler

EPOCHS = range(1, 6)
DAG = "pipe"
NEVER = 10**9


@dataclass(frozen=True)
class Row:
    """What the replay reads of a ledger row."""

    processor: str
    epoch: int
    dag_id: str = DAG

    @property
    def task_id(self) -> str:
        return self.processor


class ReplayKilled(Exception):
    """The replay's process dies (SIGKILL) in the middle of clearing."""


@dataclass
class World(Scheduler):
    """Airflow's task instances, the ledger's current rows and the completions log of one DAG."""

    rng: random.Random
    state: dict[tuple[str, int], str | None] = field(default_factory=dict)
    rows: set[tuple[str, int]] = field(default_factory=set)
    completed: set[tuple[str, int]] = field(default_factory=set)
    commits: dict[tuple[str, int], int] = field(default_factory=dict)  # since the rollback
    committed_attempt: set[tuple[str, int]] = field(default_factory=set)  # running, past its commit
    kills: set[tuple[str, int]] = field(default_factory=set)  # instances to kill on their next run
    refused: list[tuple[str, int]] = field(default_factory=list)
    clears_left: int = NEVER  # the replay dies at the clear after this many

    def __post_init__(self) -> None:
        for key in ((t, e) for e in EPOCHS for t in TASKS):  # the failure-free run
            self.state[key] = "success"
            self.rows.add(key)
            self.completed.add(key)
            self.commits[key] = 0

    # -- the jobs ------------------------------------------------------------------------

    def _run(self, key: tuple[str, int]) -> None:
        """One step of a running job: commit, then complete and succeed; or die (a kill)."""
        if key in self.kills and self.rng.random() < 0.5:
            self.kills.discard(key)  # SIGKILLed; the scheduler finds it and fails it
            self.committed_attempt.discard(key)
            self.state[key] = "failed"
        elif key not in self.committed_attempt:
            if key in self.rows and key in self.completed:
                self.refused.append(key)  # a re-run of a completed epoch: the job refuses it
                self.state[key] = "failed"
                return
            if key not in self.rows:  # a retry of an attempt that died after its commit finds it
                self.rows.add(key)
                self.commits[key] += 1
            self.committed_attempt.add(key)
        else:
            self.committed_attempt.discard(key)
            self.completed.add(key)
            self.state[key] = "success"

    # -- what the replay reads and writes (Airflow's REST API, the ledger, completions) ---

    def clear(self, dag_id: str, run_id: str, task_ids: list[str], dry_run: bool = False) -> list:
        self.advance()
        if self.clears_left <= 0:
            raise ReplayKilled
        self.clears_left -= 1
        epoch = int(run_id.split("-")[1])
        for task in task_ids:
            self.committed_attempt.discard((task, epoch))
            self.state[(task, epoch)] = None
        return []

    def produced_assets(self, dag_id: str, task_id: str) -> list[dict]:
        return []  # no task of this DAG names an Asset as an outlet

    def set_state(self, dag_id: str, run_id: str, task_id: str, state: str, note: str | None = None) -> None:
        self.advance()
        self.state[(task_id, int(run_id.split("-")[1]))] = state

    def entries(self, dag_id: str) -> list[Row]:
        self.advance()
        return [Row(t, e) for t, e in sorted(self.rows)]

    def completed_among(self, rows: list[Row]) -> list[Row]:
        self.advance()
        return [r for r in rows if (r.processor, r.epoch) in self.completed]


class Replay(RunningReplay):
    """The replay's state between its steps, without a lease (renewal is not under test)."""

    def renew(self) -> None:
        pass


def _rerun_set(rng: random.Random) -> set[tuple[str, int]]:
    """A bad epoch of one task: it and everything downstream of it, and the later epochs of
    the stateful tasks among them, as a plan would re-run."""
    task, epoch = rng.choice(TASKS), rng.choice(EPOCHS)
    below = TASKS[TASKS.index(task):]
    return {(t, e) for t in below for e in EPOCHS if e == epoch or (e > epoch and t in STATEFUL)}


def _replay(world: World, rerun: set[tuple[str, int]], monkeypatch: pytest.MonkeyPatch) -> int:
    """Roll back, then clear and wait, resumed until every re-run succeeded; returns the resumes.

    The replay stops when it is killed (the scheduler goes on while its lease expires) and when
    an instance it waits for fails (others may still run when it is resumed)."""
    monkeypatch.setattr(recovery, "Completions", lambda store: world)
    monkeypatch.setattr(recovery, "taken_over_replicas", lambda store, dag_id: set())  # no process pairs here
    plan = type("Plan", (), {"dag_id": DAG, "plan_id": "p", "failures": (), "rerun_set": lambda self: set(rerun)})()
    running = Replay(plan, None, None, world, {e: f"epoch-{e}" for e in EPOCHS}, {}, 0, 0.0, store="store")
    world.rows -= rerun  # the rollback: invalidated once, before any clear
    redone = lambda: all(world.state[k] == "success" and k in world.rows for k in rerun)  # noqa: E731
    failed = lambda: any(world.state[k] in ("failed", "upstream_failed") for k in rerun)  # noqa: E731
    resumes = 0
    while True:
        try:
            _clear(running, _to_clear(running, world, lambda *_: None), progress=lambda *_: None)
        except ReplayKilled:
            world.clears_left = NEVER  # the executor that resumes is not killed
            world.advance(8)
        else:
            while not redone() and not failed() and world.step():
                pass
            if redone():
                return resumes
        resumes += 1
        assert resumes <= 10, f"the replay does not converge: {world.state}"


@pytest.mark.parametrize("seed", range(300))
def test_a_replay_interleaved_with_the_scheduler_ends_in_the_failure_free_state(seed: int, monkeypatch) -> None:
    rng = random.Random(seed)
    world = World(rng)
    rerun = _rerun_set(rng)
    world.clears_left = rng.choice([0, 1, 2, NEVER])  # killed before, after one or two clears, or not
    world.kills = set(rng.sample(sorted(rerun), k=min(len(rerun), rng.randint(0, 2))))
    injected = (world.clears_left != NEVER) + len(world.kills)
    resumes = _replay(world, rerun, monkeypatch)

    assert world.refused == []  # no instance was cleared after it had re-run
    assert {k: world.commits[k] for k in rerun} == dict.fromkeys(rerun, 1)  # each redone once
    assert all(world.commits[k] == 0 for k in world.commits if k not in rerun)  # nothing else re-ran
    assert world.rows == set(world.state) and world.completed == set(world.state)
    assert all(s == "success" for s in world.state.values())
    # At most two resumes per fault injected: one for it, and one for an instance downstream that
    # Airflow failed (upstream_failed) after the resumed replay had read it still waiting.
    assert resumes <= 2 * injected
