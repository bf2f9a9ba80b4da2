"""The replay's clearing decisions under seeded interleavings of a scheduler, killed tasks and a
killed replay, against a brute-force check of the end state.

The replay's own loop and rules run (:func:`falkirk.plugins.replay.loop.reconcile` over
:func:`falkirk.policies.replay.decide`); its observer and applier are an in-memory model of
Airflow, the ledger and the completions log (``World``: a scheduler cannot be paused between two
REST calls, so the model stands in for them). Before answering each read or write the model lets
the scheduler take a few random steps, so that tasks start, commit, complete and succeed between
any two of the replay's reads.

Each seed draws a re-run set, when the replay is killed (after how many cleared epochs), and
which task instances are killed (before or after their commit). The replay is resumed, as a
user would, whenever it stops: killed, or ended with a failed instance. The end state must be
the failure-free run's: every re-run instance succeeded with exactly one commit after the
rollback, nothing else re-ran, and no re-run was refused as a re-run of a completed epoch
(which is what a clear of an instance that had already re-run leads to).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from falkirk.plugins.airflow_rest import AirflowError
from falkirk.plugins.replay.loop import MIN_POLL_SECONDS, reconcile
from falkirk.policies.planning.replay_decisions import AirflowRun
from falkirk.policies.replay import AirflowView, Clear, MarkSuccess, Memory, StoreView

from .replay_scheduler import STATEFUL, TASKS, Scheduler

EPOCHS = range(1, 6)
DAG = "pipe"
NEVER = 10**9


@dataclass(frozen=True)
class Row:
    """What the replay reads of a ledger row."""

    processor: str
    epoch: int
    incarnation: int = 0
    dag_id: str = DAG


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

    # -- the replay's observer and applier (Airflow's REST API, the ledger, completions) -------

    def observe(self, memory: Memory) -> tuple[StoreView, AirflowView]:
        """Airflow first (its reads let the scheduler step), then the store."""
        runs = {}
        for epoch in sorted(memory.watch):
            self.advance()
            states = {t: self.state[(t, epoch)] for t in TASKS}
            done = all(s in ("success", "failed", "upstream_failed") for s in states.values())
            run_state = ("failed" if "failed" in states.values() else "success") if done else "running"
            runs[epoch] = AirflowRun(states, dict.fromkeys(TASKS, "default"), run_state)
        self.advance()
        rows = {k: Row(*k) for k in self.rows}
        return (StoreView(rows=rows, run_ids={e: f"epoch-{e}" for e in EPOCHS},
                          completed=frozenset(k for k in rows if k in self.completed)),
                AirflowView(runs=runs))

    def apply(self, action: object) -> None:
        self.advance()
        if isinstance(action, Clear):
            if self.clears_left <= 0:
                raise ReplayKilled
            self.clears_left -= 1
            for task in action.tasks:
                self.committed_attempt.discard((task, action.epoch))
                self.state[(task, action.epoch)] = None
        elif isinstance(action, MarkSuccess):
            self.state[(action.row.processor, action.row.epoch)] = "success"

    def renew(self) -> None:
        pass  # no lease here: renewal is not under test


def _rerun_set(rng: random.Random) -> set[tuple[str, int]]:
    """A bad epoch of one task: it and everything downstream of it, and the later epochs of
    the stateful tasks among them, as a plan would re-run."""
    task, epoch = rng.choice(TASKS), rng.choice(EPOCHS)
    below = TASKS[TASKS.index(task):]
    return {(t, e) for t in below for e in EPOCHS if e == epoch or (e > epoch and t in STATEFUL)}


def _replay(world: World, rerun: set[tuple[str, int]]) -> int:
    """Roll back, then run the replay's loop, started again until every re-run succeeded; returns
    how often it was started again.

    The replay stops when it is killed (the scheduler goes on while its lease expires) and when
    an instance it waits for fails (others may still run when it is started again). Its polls are
    the scheduler's steps; its clock, one second a pass."""
    plan = SimpleNamespace(dag_id=DAG, plan_id="p", failures=(), tasks=(), last_epoch=max(EPOCHS),
                           rerun_set=lambda: frozenset(rerun))
    world.rows -= rerun  # the rollback: invalidated once, before any clear
    ticks = itertools.count()
    resumes = 0
    while True:
        memory = Memory.fresh(frozenset(rerun), {e: f"epoch-{e}" for e in EPOCHS}, 0.0, plan.last_epoch)
        try:
            reconcile(plan, world, world, memory, progress=lambda *_: None, timeout=5000, poll=1.0,
                      clock=lambda: float(next(ticks)), sleep=lambda _: world.step())
            return resumes
        except ReplayKilled:
            world.clears_left = NEVER  # the executor that resumes is not killed
            world.advance(8)
        except AirflowError:  # an instance it waited for failed: started again once it has
            pass
        resumes += 1
        assert resumes <= 10, f"the replay does not converge: {world.state}"


@pytest.mark.parametrize("seed", range(300))
def test_a_replay_interleaved_with_the_scheduler_ends_in_the_failure_free_state(seed: int) -> None:
    rng = random.Random(seed)
    world = World(rng)
    rerun = _rerun_set(rng)
    world.clears_left = rng.choice([0, 1, 2, NEVER])  # killed before, after one or two clears, or not
    world.kills = set(rng.sample(sorted(rerun), k=min(len(rerun), rng.randint(0, 2))))
    injected = (world.clears_left != NEVER) + len(world.kills)
    resumes = _replay(world, rerun)

    assert world.refused == []  # no instance was cleared after it had re-run
    assert {k: world.commits[k] for k in rerun} == dict.fromkeys(rerun, 1)  # each redone once
    assert all(world.commits[k] == 0 for k in world.commits if k not in rerun)  # nothing else re-ran
    assert world.rows == set(world.state) and world.completed == set(world.state)
    assert all(s == "success" for s in world.state.values())
    # At most two resumes per fault injected: one for it, and one for an instance downstream that
    # Airflow failed (upstream_failed) after the resumed replay had read it still waiting.
    assert resumes <= 2 * injected


@pytest.mark.parametrize("observing, waits", [(0.0, MIN_POLL_SECONDS), (0.1, 0.4), (0.3, 1.0)])
def test_the_loop_waits_between_passes_by_what_its_passes_cost(observing: float, waits: float) -> None:
    """A cheap pass is followed by a short wait (the replay notices a re-run's end sooner); a
    costly one by up to ``poll``, so that observing takes at most a fifth of the loop's time.
    The loop's clock advances by ``observing`` in each observation and by each wait."""
    world = World(random.Random(7))
    world.clears_left, world.kills = NEVER, set()
    rerun = {("model", 4), ("sink", 4), ("model", 5), ("sink", 5)}
    plan = SimpleNamespace(dag_id=DAG, plan_id="p", failures=(), tasks=(), last_epoch=max(EPOCHS),
                           rerun_set=lambda: frozenset(rerun))
    world.rows -= rerun
    observe, sleeps, now = world.observe, [], [0.0]

    def slow_observe(memory: Memory):
        now[0] += observing
        return observe(memory)

    def wait(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds
        world.step()

    world.observe = slow_observe  # type: ignore[method-assign]
    reconcile(plan, world, world, Memory.fresh(frozenset(rerun), {e: f"epoch-{e}" for e in EPOCHS}, 0.0,
                                               plan.last_epoch),
              progress=lambda *_: None, timeout=5000, poll=1.0, clock=lambda: now[0], sleep=wait)
    assert sleeps and [round(s, 9) for s in sleeps] == [waits] * len(sleeps)
