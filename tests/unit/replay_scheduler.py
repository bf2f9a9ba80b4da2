"""The scheduler both replay models share: a DAG of three tasks in a chain, two of them stateful
(each epoch waits for the task's previous one, ``depends_on_past``), whose task instances start
when their dependencies succeeded and are failed upstream when one failed; and the two REST reads
of Airflow the replay makes. A model supplies ``rng``, ``state`` and what a running job does
(``_run``), and may override how a job starts (``_start``)."""

from __future__ import annotations

import random

TASKS = ("source", "model", "sink")
STATEFUL = {"model", "sink"}


class Scheduler:
    """Random steps of a scheduler over ``state`` (``(task, epoch) -> Airflow state``)."""

    rng: random.Random
    state: dict[tuple[str, int], str | None]

    def _deps(self, task: str, epoch: int) -> list[str | None]:
        deps = [self.state[(TASKS[TASKS.index(task) - 1], epoch)]] if task != TASKS[0] else []
        if task in STATEFUL and epoch > 1:
            deps.append(self.state[(task, epoch - 1)])
        return deps

    def steps(self) -> list:
        """Every step the scheduler or a job could take now."""
        possible = []
        for key, state in self.state.items():
            if state is None:
                deps = self._deps(*key)
                if any(d in ("failed", "upstream_failed") for d in deps):
                    possible.append((self._set, key, "upstream_failed"))
                elif all(d == "success" for d in deps):
                    possible.append((self._start, key))
            elif state == "running":
                possible.append((self._run, key))
        return possible

    def _set(self, key: tuple[str, int], state: str) -> None:
        self.state[key] = state

    def _start(self, key: tuple[str, int]) -> None:
        self.state[key] = "running"

    def _run(self, key: tuple[str, int]) -> None:
        raise NotImplementedError

    def step(self) -> bool:
        """Take one random step; False if none is possible (everything settled)."""
        possible = self.steps()
        if possible:
            step = self.rng.choice(possible)
            step[0](*step[1:])
        return bool(possible)

    def advance(self, most: int = 3) -> None:
        for _ in range(self.rng.randint(0, most)):
            self.step()

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        self.advance()
        epoch = int(run_id.split("-")[1])
        return {t: {"state": self.state[(t, epoch)], "queue": "default"} for t in TASKS}

    def run_exists(self, dag_id: str, run_id: str) -> bool:
        return True  # the model deletes no run

    def set_run_state(self, dag_id: str, run_id: str, state: str, note: str) -> None:
        pass  # the model's run states follow from its task instances (dag_run)

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        self.advance()
        states = [self.state[(t, int(run_id.split("-")[1]))] for t in TASKS]
        done = all(s in ("success", "failed", "upstream_failed") for s in states)
        return {"state": ("failed" if "failed" in states else "success") if done else "running"}
