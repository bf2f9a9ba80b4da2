"""The replay's observer reads the ledger once, then only what was committed since: one snapshot
brought forward per pass, and no plan computed again inside the loop."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from falkirk.plugins.replay.loop import reconcile
from falkirk.plugins.replay.observe import Observer
from falkirk.policies.planning import from_ledger
from falkirk.policies.replay import Clear, Memory
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerSnapshot

TASKS = ("source", "model")


class Airflow:
    """Airflow's REST API as the observer reads it: a scheduler that runs each cleared instance
    to success (committing its ledger row) over two polls."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.state = {(t, e): "success" for t in TASKS for e in range(1, 5)}
        self.polls = 0

    def on_poll(self) -> None:
        self.polls += 1
        for (task, epoch), state in sorted(self.state.items()):
            if state is None:
                self.state[task, epoch] = "running"
            elif state == "running":
                self.ledger.append(row(task, epoch, incarnation=1))
                self.state[task, epoch] = "success"

    def runs_with_instances(self, dag_id: str, run_ids) -> dict:
        return {r: (self.find_run(dag_id, r), self.task_instances(dag_id, r)) for r in run_ids}

    def find_run(self, dag_id: str, run_id: str) -> dict:
        epoch = int(run_id.split("-")[1])
        done = all(self.state[t, epoch] == "success" for t in TASKS)
        return {"state": "success" if done else "running"}

    def task_instances(self, dag_id: str, run_id: str) -> dict:
        epoch = int(run_id.split("-")[1])
        return {t: {"state": self.state[t, epoch], "queue": "default"} for t in TASKS}

    def dag(self, dag_id: str) -> dict:
        return {"is_paused": False, "max_active_runs": 16}

    def active_runs(self, dag_id: str) -> list:
        return []

    def apply(self, action: object) -> None:
        if isinstance(action, Clear):
            for task in action.tasks:
                self.state[task, action.epoch] = None

    def renew(self) -> None:
        pass


def row(task: str, epoch: int, incarnation: int = 0) -> LedgerEntry:
    return LedgerEntry(dag_id="d", task_id=task, epoch=epoch, regime="eager_checkpoint", run_id=f"epoch-{epoch}",
                       try_number=1 + incarnation, incarnation=incarnation)


def test_a_replay_reads_the_ledger_once_and_then_only_the_commits_made_since(tmp_path, monkeypatch) -> None:
    store = StoreConfig(durable_uri=str(tmp_path / "store"), scratch_uri=str(tmp_path / "scratch"))
    ledger = Ledger(store)
    for e in range(1, 5):
        for t in TASKS:
            ledger.append(row(t, e))
    rerun = frozenset({("model", 3), ("model", 4)})
    ledger.invalidations.record([row("model", 3), row("model", 4)], "p1")
    replans = []
    monkeypatch.setattr(from_ledger, "compute_plan", lambda *a, **k: replans.append(a))  # counted, never called
    plan = SimpleNamespace(dag_id="d", plan_id="p1", failures=(), last_epoch=4, rerun_set=lambda: rerun,
                           tasks=(SimpleNamespace(task_id="model", rerun=(3, 4), regime="eager_checkpoint"),))
    airflow = Airflow(ledger)
    before = Ledger.reads
    snapshot = LedgerSnapshot(ledger, "d")
    observer = Observer(plan, store, airflow, snapshot)
    ticks = itertools.count()
    memory = reconcile(plan, observer, airflow, Memory.fresh(rerun, {e: f"epoch-{e}" for e in range(1, 5)}, 0.0, 4),
                       progress=lambda _: None, poll=1.0, clock=lambda: float(next(ticks)), sleep=lambda _: None)

    reads = Ledger.reads - before
    assert memory.stage == "done" and memory.cleared == {"epoch-3": ("model",), "epoch-4": ("model",)}
    assert [(e.epoch, e.incarnation) for e in ledger.entries("d") if e.task_id == "model"] == [
        (1, 0), (2, 0), (3, 1), (4, 1)]
    passes = airflow.polls
    # the clears; the re-runs running; done, and with no later run in the ledger, settling,
    # handing back and the second runs over that same observation
    assert passes == 3
    assert snapshot.scans == 2 and snapshot.refreshes == passes  # one whole read of each table, then tails
    assert reads == 1  # the snapshot's first read: no pass read the whole ledger again
    assert replans == []
