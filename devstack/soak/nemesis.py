"""The soak's nemesis: injects each fault of the schedule into the running shape, for real.

Each kind is a method named after it. A fault that has a hold (an S3 outage) is undone when
the hold ends, by a timer of its own (the soak's loop may be waiting on the store meanwhile,
as a user's command would); a killed component is started again at once, as a supervisor
(systemd, Kubernetes) would. What a user must do afterwards (plan and
replay) is not the nemesis's business: :mod:`devstack.soak.run` does it as a user would.

Each injection returns a :class:`Injected`: what was done, when, and what it hit, for the report.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from devstack.soak.schedule import Fault

if TYPE_CHECKING:  # run imports this module
    from devstack.soak.run import Soak

SUPPORTED = ("kill-worker", "lose-worker", "kill-job", "kill-scheduler", "kill-api-server", "kill-replay",
             "freeze-s3", "refuse-s3", "clock-shift", "mistaken-trigger", "gc", "bad-input")
"""The kinds injected (every kind of :data:`devstack.soak.schedule.KINDS`)."""
CLOCKS_ENV = "FALKIRK_SOAK_CLOCKS"  # the directory of each worker's clock shift (clock/sitecustomize.py)
CLOCK_DIR = Path(__file__).with_name("clock")  # put on the shape's PYTHONPATH


@dataclass
class Injected:
    """One fault as injected: the scheduled fault, when it landed, what it hit, and when it was undone."""

    fault: Fault
    landed: float
    hit: str
    undone: float | None = None
    recoveries: list[str] = field(default_factory=list)  # the plan ids a user replayed after it
    epoch: int = 0  # figure1's newest epoch triggered when it landed (bad-input: the epoch it spoiled)
    reached: dict[str, int] = field(default_factory=dict)  # each DAG's newest epoch triggered when it landed
    caught_up_in: float | None = None  # from its landing until every epoch up to ``epoch`` succeeded
    settled: bool = True  # bad-input: False until the recovery of its epoch has replayed

    def line(self) -> str:
        held = f", undone at {self.undone:.0f}s" if self.undone is not None else ""
        caught = f"; caught up {self.caught_up_in:.0f}s later" if self.caught_up_in is not None else ""
        return f"{self.fault.describe()}  landed at {self.landed:.0f}s: {self.hit}{held}{caught}"


def _worker_of(fault: Fault) -> str:
    """The worker a worker fault targets (the schedule draws one for each)."""
    if fault.target is None:
        raise ValueError(f"fault {fault.kind} at {fault.at:.0f}s names no worker")
    return fault.target


class Nemesis:
    """Faults against ``soak`` (a :class:`devstack.soak.run.Soak`: its shape, S3 front, crash
    file, and its DAGs' epochs and running replays). A fault aimed at one DAG (a job, a replay, a
    trigger) picks it with the schedule's random generator, so a seed draws the same aims again."""

    def __init__(self, soak: Soak, rng: random.Random) -> None:
        self.soak = soak
        self.rng = rng
        self._holds: list[tuple[threading.Timer, Injected]] = []
        self._replacements: list[tuple[threading.Timer, str]] = []  # lost workers not started again yet
        self._lock = threading.Lock()

    def inject(self, fault: Fault) -> Injected:
        """Inject ``fault`` now; a held fault is undone by a timer when its hold ends."""
        hit = getattr(self, fault.kind.replace("-", "_"))(fault)
        injected = Injected(fault, self.soak.elapsed(), hit)
        if fault.hold is not None:
            timer = threading.Timer(fault.hold, self._undo, (injected,))
            timer.daemon = True
            self._holds.append((timer, injected))
            timer.start()
        return injected

    def _undo(self, injected: Injected) -> None:
        if injected.fault.kind == "clock-shift" and injected.fault.target is not None:
            self._shift(injected.fault.target, 0)
        else:
            self.soak.front.up()
        injected.undone = self.soak.elapsed()
        self.soak.progress(f"{injected.undone:6.0f}s  {injected.fault.kind} ended")

    def end(self) -> None:
        """Undo every hold still running and start every lost worker not replaced yet (the soak is
        ending)."""
        for timer, injected in self._holds:
            timer.cancel()
            if injected.undone is None:
                self._undo(injected)
        self._holds.clear()
        for timer, name in self._replacements:
            timer.cancel()
            self._replace(name)
        self._replacements.clear()

    # --- the kinds ------------------------------------------------------------------------------

    def kill_worker(self, fault: Fault) -> str:
        name = _worker_of(fault)
        worker = self.soak.cluster.airflow.worker(name)
        worker.kill()
        worker.start()
        return f"{name} killed and started again, its disk kept"

    def lose_worker(self, fault: Fault) -> str:
        """The machine is gone: the worker killed, its disk deleted, and a new machine of the same
        name started on an empty disk ``REPLACED_AFTER`` seconds later (long enough for
        ``falkirk watch`` to find it silent). A user plans the lost worker for the DAGs that
        have not opted in to ``falkirk watch``'s replays."""
        name = _worker_of(fault)
        worker = self.soak.cluster.airflow.worker(name)
        worker.kill()
        disk = self.soak.cluster.scratch_root(name)
        shutil.rmtree(disk, ignore_errors=True)
        for driven in self.soak.dags:
            if not driven.dag.auto_recover:
                driven.lost_workers.add(name)
        timer = threading.Timer(REPLACED_AFTER, self._replace, (name,))
        timer.daemon = True
        self._replacements.append((timer, name))
        timer.start()
        return (f"{fault.target} killed, its disk {disk} deleted; a new {fault.target} starts on an empty disk in "
                f"{REPLACED_AFTER:.0f}s")

    def running(self, name: str) -> bool:
        """Whether worker ``name``'s Celery worker runs now (a lost one once its replacement started)."""
        proc = self.soak.cluster.airflow.worker(name).proc
        return proc is not None and proc.poll() is None

    def _replace(self, name: str) -> None:
        with self._lock:
            worker = self.soak.cluster.airflow.worker(name)
            if worker.proc is None or worker.proc.poll() is not None:  # not started again by another fault
                worker.start()
                self.soak.progress(f"{self.soak.elapsed():6.0f}s  a new {name} started on an empty disk")

    def clock_shift(self, fault: Fault) -> str:
        """The worker's wall clock (and its jobs') runs ``hold`` seconds ahead, for the hold."""
        target, hold = str(fault.target), float(fault.hold or 0)
        self._shift(target, hold)
        return f"{target}'s clock {hold:.0f}s ahead"

    def _shift(self, worker: str, seconds: float) -> None:
        clock = self.soak.clocks / worker
        clock.parent.mkdir(parents=True, exist_ok=True)
        tmp = clock.with_suffix(".tmp")
        tmp.write_text(f"{seconds}\n", encoding="utf-8")
        tmp.replace(clock)  # read whole or not at all

    def kill_job(self, fault: Fault) -> str:
        """Arm a crash point (a SIGKILL of the job itself, at a step of its commit or inside its
        epoch) in the next epoch a task instance of one DAG runs: the epoch after the newest one
        triggered."""
        driven = self.rng.choice(self.soak.dags)
        processor = self.rng.choice(driven.dag.processors())
        task = processor.partition("[")[0]
        step = self.rng.choice(("before-commit", "after-outputs", "after-state", "after-completion",
                                *driven.dag.crash_steps.get(task, ())))
        epoch = driven.latest_epoch + 1
        with self.soak.crash_file.open("a", encoding="utf-8") as f:
            f.write(f"{driven.dag_id}/{processor}:{epoch}:{step}:once\n")
        return f"{driven.dag_id}.{processor} epoch {epoch} armed to die at {step}"

    def kill_scheduler(self, fault: Fault) -> str:
        return self._kill_component("scheduler")

    def kill_api_server(self, fault: Fault) -> str:
        return self._kill_component("api-server")

    def _kill_component(self, name: str) -> str:
        airflow = self.soak.cluster.airflow
        airflow.kill(name)
        started = time.monotonic()
        airflow.restart(name, timeout=300)
        return f"{name} killed, started again and answering after {time.monotonic() - started:.0f}s"

    def kill_replay(self, fault: Fault) -> str:
        running = [d for d in self.soak.dags if d.replay is not None and d.replay.poll() is None]
        if not running:
            self.soak.kill_next_replay = True
            return "no replay running: the next one is killed as it starts"
        driven = self.rng.choice(running)
        replay = driven.replay
        assert replay is not None  # chosen among the running ones
        replay.kill()
        return f"{driven.dag_id}'s falkirk replay (pid {replay.pid}) killed"

    def freeze_s3(self, fault: Fault) -> str:
        self.soak.front.hang_at("GET", "")
        return "S3 endpoint frozen: the next GET and every request after it hang"

    def refuse_s3(self, fault: Fault) -> str:
        self.soak.front.down()
        return "S3 endpoint down: connections refused"

    def mistaken_trigger(self, fault: Fault) -> str:
        from falkirk.plugins.airflow_rest import AirflowError

        driven = self.rng.choice([d for d in self.soak.dags if d.dag.fed is None])  # triggered by hand
        epoch = driven.latest_epoch + 30
        try:
            self.soak.client.trigger(driven.dag_id, f"mistaken-{epoch}", driven.clock.logical_date(epoch),
                                     attempts=1)
        except AirflowError as exc:
            return f"a trigger of {driven.dag_id} at epoch {epoch} refused ({str(exc)[:120]})"
        driven.mistaken.append(f"mistaken-{epoch}")
        return f"a trigger of {driven.dag_id} at epoch {epoch} ACCEPTED"

    def bad_input(self, fault: Fault) -> str:
        """The next epoch's batch lands incomplete; upstream delivers it again whole once two
        later epochs have read on, and the soak recovers it as a bad epoch (``Soak._deliver_again``)."""
        epoch = self.soak.inputs.latest_epoch + 1
        source = self.soak.inputs.source
        assert source is not None  # the soak's first DAG is figure1, fed by the clickstream
        source.deliver_incomplete(epoch)
        return f"clickstream epoch {epoch} delivered with a tenth of its events missing"

    def gc(self, fault: Fault) -> str:
        """``falkirk gc --dag D`` for each DAG in turn."""
        said = []
        for driven in self.soak.dags:
            done = subprocess.run([*self.soak.falkirk, "gc", "--dag", driven.dag_id], env=self.soak.cli_env,
                                  capture_output=True, text=True, timeout=600)
            last = (done.stdout.strip().splitlines() or [done.stderr.strip()[-200:]])[-1]
            said.append(f"{driven.dag_id} exited {done.returncode}: {last[:120]}")
        return "falkirk gc: " + "; ".join(said)


REPLACED_AFTER = 30.0  # seconds until a lost worker's replacement starts (falkirk watch: lost after 15 s)


def kinds_supported(kinds: list[str]) -> None:
    """Refuse a mix naming a kind the nemesis does not inject yet, naming it and the fix."""
    missing = sorted(set(kinds) - set(SUPPORTED))
    if missing:
        raise ValueError(f"--mix: {', '.join(missing)} not injected yet; the soak injects {', '.join(SUPPORTED)}")


def ensure_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path
