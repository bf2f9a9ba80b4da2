"""``make soak``: continuous epochs on the distributed shape while a seeded schedule of faults
lands, recovered as a user would, then every table compared with a failure-free run.

1. starts the shape (:class:`devstack.cluster.Cluster`: PostgreSQL, Redis, the S3-compatible
   server behind a front that can freeze or refuse, a Spark standalone cluster behind a Spark
   Connect server, Airflow with the CeleryExecutor and two workers with their own disks);
2. triggers epochs of ``falkirk_figure1`` (its four regimes and an exactly-once SQL sink) one
   after another, a few in flight, for ``--duration``;
3. meanwhile injects the faults :class:`~devstack.soak.schedule.FaultSchedule` drew from the
   seed (:mod:`devstack.soak.nemesis`), and after each does what a user would: a DAG run that
   failed is planned (``falkirk plan --failed-task``, with ``--lost-worker`` for a worker that
   lost its disk), an input batch delivered again whole is planned as a bad epoch
   (``--bad-epoch events:E``), and the plan is replayed (``falkirk replay``; a killed replay is
   run again; a plan refused as stale because runs kept committing is planned again with no
   new epoch triggered until a replay gets past that check, as a user lets the runs in flight
   finish first);
4. meanwhile runs the same epochs failure-free in a process beside it
   (:mod:`devstack.inprocess`, :class:`ReferenceBeside`);
5. stops triggering, recovers until every epoch's run succeeded (the time to caught-up),
   collects both DAGs and compares every durable table and the SQL sink with the failure-free
   run's, row for row, then checks that no ledger row is doubled, no epoch is missing, no lease
   is held and no table in the store is outside what the ledger names;
   (and along the way, every ten minutes or half a shorter soak: the rows of the epochs
   settled so far, :func:`check_through`);
6. prints the report (:mod:`devstack.soak.report`, also written to ``report.txt`` and, its
   figures as Markdown, ``report.md``): the faults by kind with their times to caught-up, each
   fault's landing and recoveries, the discrepancies with the rows that differ, and the
   command that draws the same schedule again.

Exit code 0 when nothing differs, 1 otherwise. ``--broken`` (``FALKIRK_BROKEN``) gets a step
recovery relies on wrong on purpose, for a soak that must fail.

    make soak DURATION=20m SEED=7
    .venv/bin/python -m devstack.soak.run --duration 4m --seed 7 --mix kill-worker=2,gc=1
    make soak BROKEN=gc-watermark SEED=8 DURATION=4m MIX=kill-job=1,gc=1 MEAN_GAP=40
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from devstack.airflow import PROJECT_ROOT
from devstack.cluster import Cluster, ClusterServers
from devstack.cluster_demo import (DAG_ID, DAGS, QUEUES_ENV, REFERENCE, TASKS, Progress, _canonical, _clock,
                                   _rows, say)
from devstack.inprocess import run_reference_process
from devstack.processes import VENV_BIN
from devstack.soak.nemesis import CLOCK_DIR, CLOCKS_ENV, SUPPORTED, Injected, Nemesis, ensure_file, kinds_supported
from devstack.soak.schedule import FaultSchedule, Mix, parse_duration
from falkirk.policies import faults
from falkirk.plugins.cli import EXIT_STORE
from falkirk.policies.faults import BROKEN, BROKEN_ENV, CRASH_ENV
from falkirk.policies.planning.recovery_log import RecoveryLog, open_lease
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger
from falkirk.spark_jobs.figure1.data import RECORDS_ENV
from falkirk.spark_jobs.figure1.popularity import WINDOW
from falkirk.spark_jobs.figure1.query_store import QueryStatsStore
from falkirk.spark_jobs.figure1.source import ClickstreamSource

IN_FLIGHT = 2  # epochs triggered and not finished, at most
STALE_PLAN = "the ledger changed since the plan was computed"  # falkirk replay's refusal of a stale plan
RETRY_SECONDS = 15  # a replay stopped by an unreachable store or a held lease is run again after this
CHECK_EVERY = 600  # seconds between the checks along the way (half a shorter soak)


@dataclass
class Recovery:
    """One recovery a user made: the plan, its size, when it started and how long its replay took."""

    plan_id: str
    reruns: int
    planned_at: float
    why: str
    replayed_in: float | None = None
    attempts: int = 0
    bad_epochs: list[int] = field(default_factory=list)  # the epochs of events it recovers as bad


@dataclass
class SoakReport:
    schedule: FaultSchedule
    injected: list[Injected] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    epochs: int = 0
    caught_up_in: float | None = None
    discrepancies: list[str] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    along_the_way: list[tuple[float, int, int]] = field(default_factory=list)  # (at, through epoch, differences)
    broken: str = ""  # the recovery steps broken on purpose (FALKIRK_BROKEN), if any

    @property
    def ok(self) -> bool:
        return self.caught_up_in is not None and not self.discrepancies


class Soak:
    """One soak on a started shape: the loop that keeps epochs running, injects the faults and
    recovers from them."""

    def __init__(self, cluster: Cluster, schedule: FaultSchedule, root: Path, progress: Progress = say,
                 broken: str = "") -> None:
        self.cluster = cluster
        self.front = cluster.front
        self.schedule = schedule
        self.progress = progress
        self.client = cluster.airflow.client()
        self.dag_id = DAG_ID
        self.tasks = TASKS
        self.clock = _clock()
        self.crash_file = ensure_file(root / "crash_at")
        self.clocks = root / "clocks"  # each worker's clock shift (devstack/soak/clock/sitecustomize.py)
        self.lost_workers: set[str] = set()
        self.replay: subprocess.Popen[str] | None = None
        self.replaying: Recovery | None = None
        self.kill_next_replay = False
        self.latest_epoch = 0
        self.mistaken: list[str] = []
        self.source = ClickstreamSource(cluster.airflow.env()["FALKIRK_CLICKSTREAM_ACKS"].replace("{dag_id}", DAG_ID))
        self.spoiled: dict[int, Injected] = {}  # epochs delivered incomplete, not delivered again yet
        self.delivered_again: dict[int, Injected] = {}  # ... delivered again, their recovery not replayed yet
        self.ending = False  # the duration is reached: no more epochs are triggered
        self.replay_due: tuple[Recovery, float] | None = None  # a replay to run again, and when
        # A plan went stale before its replay began (runs kept committing): no new epochs until a
        # replay ends otherwise, as a user lets the runs in flight finish before planning again.
        self.holding = False
        self.reference: ReferenceBeside | None = None  # the failure-free run, for the checks along the way
        self.check_every = min(CHECK_EVERY, schedule.duration / 2)
        self._next_check = self.check_every
        self.falkirk = [str(VENV_BIN / "falkirk")]
        self.cli_env = {**os.environ, **cluster.store.env(), "FALKIRK_AIRFLOW_URL": cluster.airflow.base_url,
                        "FALKIRK_AIRFLOW_USER": "admin", "FALKIRK_AIRFLOW_PASSWORD": "admin",
                        **({BROKEN_ENV: broken} if broken else {})}
        self.report = SoakReport(schedule, broken=broken)
        self.nemesis = Nemesis(self, random.Random(schedule.seed))
        self._attributed = 0  # faults before this index are named by a recovery already
        self._started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def run(self, catch_up_timeout: float = 1800) -> SoakReport:
        self.client.wait_for_dag(self.dag_id)
        self.client.set_paused(self.dag_id, False)
        self._started = time.monotonic()
        faults = list(self.schedule.faults)
        while self.elapsed() < self.schedule.duration:
            due = next((f for f in faults if f.at <= self.elapsed() and not self._postponed(f)), None)
            if due is not None:
                faults.remove(due)
                self._inject(due)
            self._tick(trigger=True)
        for fault in faults:  # a tick ran long: the rest land now, in order
            if self._postponed(fault):
                self._not_landed(fault, "a batch delivered incomplete still awaited its recovery at the end")
            else:
                self._inject(fault)
        self.nemesis.end()
        self.ending = True
        self.progress(f"{self.elapsed():6.0f}s  duration reached at epoch {self.latest_epoch}; catching up")
        ended = self.elapsed()
        deadline = time.monotonic() + catch_up_timeout
        while not self._caught_up():
            if time.monotonic() > deadline:
                self.report.discrepancies.append(f"not caught up {catch_up_timeout:.0f}s after the last epoch: "
                                                 f"{self._states()}")
                break
            self._tick(trigger=False)
        else:
            self.report.caught_up_in = self.elapsed() - ended
        self.report.epochs = self.latest_epoch
        return self.report

    def _postponed(self, fault) -> bool:  # noqa: ANN001
        """A ``gc`` waits while a batch is known to be incomplete and its recovery has not replayed:
        collecting below that epoch would leave its recovery nothing to restore but the empty
        state, and the source has forgotten the input a recovery from there reads. A team told
        that a batch will be delivered again collects only once it is recovered."""
        return fault.kind == "gc" and bool(self.spoiled or self.delivered_again)

    def _not_landed(self, fault, why: str) -> None:  # noqa: ANN001
        injected = Injected(fault, self.elapsed(), f"not landed: {why}")
        injected.epoch = self.latest_epoch
        self.report.injected.append(injected)
        self.progress(f"{self.elapsed():6.0f}s  FAULT {injected.line()}")

    def _inject(self, fault) -> None:  # noqa: ANN001
        try:
            injected = self.nemesis.inject(fault)
        except Exception as exc:  # noqa: BLE001 - a fault that could not land is reported, not fatal
            injected = Injected(fault, self.elapsed(), f"could not inject: {exc}")
        injected.epoch = self.latest_epoch
        if fault.kind == "bad-input" and not injected.hit.startswith("could not"):
            injected.epoch, injected.settled = self.latest_epoch + 1, False
            self.spoiled[injected.epoch] = injected
        self.report.injected.append(injected)
        self.progress(f"{self.elapsed():6.0f}s  FAULT {injected.line()}")

    def _tick(self, trigger: bool) -> None:
        """One turn of the loop: keep epochs flowing, recover what failed."""
        try:
            runs = self._runs()
            self._note_caught_up(runs)
            if trigger:
                self._trigger(runs)
            self._recover(runs)
            if trigger and self.elapsed() >= self._next_check:
                self._check_along_the_way(runs)
        except Exception as exc:  # noqa: BLE001 - Airflow or the store is down for a moment: next tick
            self.progress(f"{self.elapsed():6.0f}s  (tick: {type(exc).__name__}: {str(exc)[:200]})")
        time.sleep(1)

    def _runs(self) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = []
        while True:
            page = self.client.request("GET", f"/api/v2/dags/{self.dag_id}/dagRuns",
                                       params={"limit": 100, "offset": len(runs), "order_by": "run_after"})
            runs += page["dag_runs"]
            if not page["dag_runs"] or len(runs) >= page["total_entries"]:
                return [r for r in runs if r["dag_run_id"].startswith("epoch-")]

    def _states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for run in self._runs():
            counts[run["state"]] = counts.get(run["state"], 0) + 1
        return counts

    def _note_caught_up(self, runs: list[dict[str, Any]]) -> None:
        """Each fault's time to caught-up: until every epoch triggered before it landed succeeded."""
        state = {_epoch_of(r): r["state"] for r in runs}
        for injected in self.report.injected:
            if injected.caught_up_in is None and injected.settled \
                    and all(state.get(e) == "success" for e in range(1, injected.epoch + 1)):
                injected.caught_up_in = self.elapsed() - injected.landed

    def _trigger(self, runs: list[dict[str, Any]]) -> None:
        if any(r["state"] == "failed" for r in runs) or self.holding:
            return  # a user recovers before asking for more
        if sum(r["state"] in ("queued", "running") for r in runs) >= IN_FLIGHT:
            return
        epoch = self.latest_epoch + 1
        self.client.trigger(self.dag_id, f"epoch-{epoch}", self.clock.logical_date(epoch))
        self.latest_epoch = epoch

    def _recover(self, runs: list[dict[str, Any]]) -> None:
        """What a user does: a replay that was killed is run again; a failed run, or a batch
        delivered again, is planned and replayed."""
        if self.replay_due is not None:
            recovery, due = self.replay_due
            if self.elapsed() >= due:
                self.replay_due = None
                self._start_replay(recovery)
            return
        if self.replay is not None:
            code = self.replay.poll()
            if code is None:
                return
            recovery = self.replaying
            assert recovery is not None
            output = self.replay.stdout.read() if self.replay.stdout else ""
            self.replay = None
            self.holding = STALE_PLAN in output
            if code == 0:
                recovery.replayed_in = self.elapsed() - recovery.planned_at
                self.progress(f"{self.elapsed():6.0f}s  replay {recovery.plan_id} done in {recovery.replayed_in:.0f}s")
                self.lost_workers.clear()
                for epoch in recovery.bad_epochs:
                    self.delivered_again.pop(epoch).settled = True
                if recovery.bad_epochs and not self.delivered_again:
                    self.source.recovered()
                self.replaying = None
                return
            said = output.strip().splitlines()[-1][:200] if output.strip() else "no output"
            if code < 0 or "cannot reach Airflow" in said:  # killed, or Airflow was: a user runs it again
                why = f"killed ({code})" if code < 0 else "stopped: Airflow was unreachable"
                self.progress(f"{self.elapsed():6.0f}s  replay {recovery.plan_id} {why}: running it again")
                self._start_replay(recovery)
                return
            if code == EXIT_STORE or "is being recovered by plan" in said:
                # The store did not answer, or a replay that stopped while it did not still holds
                # the lease (it could not release it): as the message says, a user waits a little
                # and runs the replay again.
                why = "the store was unreachable" if code == EXIT_STORE else "another plan's lease is held"
                self.progress(f"{self.elapsed():6.0f}s  replay {recovery.plan_id} stopped ({why}): running it again "
                              f"in {RETRY_SECONDS}s")
                self.replay_due = (recovery, self.elapsed() + RETRY_SECONDS)
                return
            # It stopped on a failure it names (another fault's): the next tick plans again, from
            # every failed task instance, as a user reading that message would.
            self.progress(f"{self.elapsed():6.0f}s  replay {recovery.plan_id} ended {code}: {said}")
            self.replaying = None
            return
        failed = {ti["task_id"] for ti in self._failed_task_instances()} | self._stranded(runs)
        self._deliver_again(runs)
        bad = sorted(self.delivered_again)
        if not failed and not bad:
            return
        args = ["plan", "--dag", self.dag_id, "--json", *(a for t in sorted(failed) for a in ("--failed-task", t)),
                *(a for w in sorted(self.lost_workers) for a in ("--lost-worker", w)),
                *(a for e in bad for a in ("--bad-epoch", f"events:{e}"))]
        done = subprocess.run([*self.falkirk, *args], env=self.cli_env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()
            self.progress(f"{self.elapsed():6.0f}s  falkirk {' '.join(args)} exited {done.returncode}: {said[-300:]}")
            # A lost worker that held none of the DAG's scratch data changes nothing: as the
            # message says, a user plans again without it.
            self.lost_workers -= {w for w in self.lost_workers if f"--lost-worker {w!r}" in said
                                  and "changes nothing" in said}
            return
        plan = json.loads(done.stdout)
        why = [f"failed: {', '.join(sorted(failed))}"] if failed else []
        why += [f"lost: {', '.join(sorted(self.lost_workers))}"] if self.lost_workers else []
        why += [f"delivered again: events {', '.join(map(str, bad))}"] if bad else []
        recovery = next((r for r in self.report.recoveries if r.plan_id == plan["plan_id"] and r.replayed_in is None),
                        None)  # the same plan again (nothing changed since): one recovery, replayed again
        if recovery is None:
            recovery = Recovery(plan["plan_id"], sum(len(t["rerun"]) for t in plan["tasks"]), self.elapsed(),
                                "; ".join(why), bad_epochs=bad)
            self.report.recoveries.append(recovery)
        for injected in self.report.injected[self._attributed:]:  # the faults since the last plan
            if injected.settled or injected.epoch in bad:  # a spoiled input waits for its own plan
                injected.recoveries.append(recovery.plan_id)
        for epoch in bad:
            if recovery.plan_id not in self.delivered_again[epoch].recoveries:
                self.delivered_again[epoch].recoveries.append(recovery.plan_id)
        self._attributed = len(self.report.injected)
        self.progress(f"{self.elapsed():6.0f}s  plan {recovery.plan_id}: {recovery.reruns} re-runs ({recovery.why})")
        self._start_replay(recovery)

    def _settled_through(self, runs: list[dict[str, Any]]) -> int:
        """The last epoch whose rows are final for now: every run up to it succeeded, no replay is
        under way, and no input up to it waits to be delivered again or recovered."""
        if self.replay is not None or self.replay_due is not None:
            return 0
        state = {_epoch_of(r): r["state"] for r in runs}
        waiting = min([*self.spoiled, *self.delivered_again], default=self.latest_epoch + 1)
        through = 0
        while through + 1 < waiting and state.get(through + 1) == "success":
            through += 1
        return through

    def _check_along_the_way(self, runs: list[dict[str, Any]]) -> None:
        """Every ``check_every`` seconds, once the failure-free run has caught up with a settled
        epoch: the durable tables and the SQL sink up to it (:func:`check_through`)."""
        if self.reference is None:
            return
        through = min(self._settled_through(runs), self.reference.done)
        if through <= (self.report.along_the_way[-1][1] if self.report.along_the_way else 0):
            return
        found = check_through(self.cluster, through)
        self.report.along_the_way.append((self.elapsed(), through, len(found)))
        self.report.discrepancies += [f"at {self.elapsed():.0f}s, through epoch {through}: {d}" for d in found]
        self.progress(f"{self.elapsed():6.0f}s  checked epochs 1-{through} against the failure-free run: "
                      + (f"{len(found)} DIFFER: {found[0][:300]}" if found else "equal"))
        self._next_check = self.elapsed() + self.check_every

    def _deliver_again(self, runs: list[dict[str, Any]]) -> None:
        """Upstream delivers each incomplete batch again, whole, once its epoch succeeded and two
        later epochs were triggered (read on from it); the user then plans it as a bad epoch."""
        state = {_epoch_of(r): r["state"] for r in runs}
        for epoch in sorted(self.spoiled):
            if state.get(epoch) == "success" and (self.latest_epoch >= epoch + 2 or self.ending):
                self.source.deliver_again(epoch, reopen_from=max(1, epoch - WINDOW + 1))
                self.delivered_again[epoch] = self.spoiled.pop(epoch)
                self.progress(f"{self.elapsed():6.0f}s  clickstream epoch {epoch} delivered again, whole")

    def _start_replay(self, recovery: Recovery) -> None:
        recovery.attempts += 1
        self.replaying = recovery
        self.replay = subprocess.Popen([*self.falkirk, "replay", recovery.plan_id], env=self.cli_env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if self.kill_next_replay:
            self.kill_next_replay = False
            time.sleep(3)
            if self.replay.poll() is None:
                self.replay.kill()
                self.progress(f"{self.elapsed():6.0f}s  FAULT kill-replay landed on replay {recovery.plan_id}")
            else:  # it ended within the 3 s: the next replay is killed instead
                self.kill_next_replay = True

    def _stranded(self, runs: list[dict[str, Any]]) -> set[str]:
        """``task:epoch`` of the instances a failed DAG run holds that never started (a run failed
        with nothing failed in it: the Grid shows them without a state): a user plans them too."""
        stranded = set()
        for run in runs:
            if run["state"] != "failed":
                continue
            tis = self.client.task_instances(self.dag_id, run["dag_run_id"])
            if not any(ti.get("state") == "failed" for ti in tis.values()):
                stranded |= {f"{t}:{_epoch_of(run)}" for t, ti in tis.items()
                             if ti.get("state") in (None, "upstream_failed")}
        return stranded

    def _failed_task_instances(self) -> list[dict[str, Any]]:
        data = self.client.request("GET", f"/api/v2/dags/{self.dag_id}/dagRuns/~/taskInstances",
                                   params={"state": "failed", "limit": 100})
        return data["task_instances"]

    def _caught_up(self) -> bool:
        runs = self._runs()
        return (self.replay is None and self.replay_due is None and not self.spoiled and not self.delivered_again
                and len(runs) >= self.latest_epoch and all(r["state"] == "success" for r in runs))


def _epoch_of(run: dict[str, Any]) -> int:
    """The epoch of a DAG run the soak triggered (``epoch-N``)."""
    return int(run["dag_run_id"].split("-", 1)[1])


class ReferenceBeside:
    """The failure-free run, made beside the soak in a process of its own: every ``every``
    seconds it runs the epochs triggered since its last turn, so that at the end only the last
    few are left to run (:meth:`through`)."""

    def __init__(self, env: dict[str, str], latest: Callable[[], int], every: float = 45) -> None:
        self.env, self.latest, self.every = env, latest, every
        self.done = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="reference", daemon=True)

    def start(self) -> "ReferenceBeside":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self._run_to(self.latest())
            except BaseException as exc:  # noqa: BLE001 - raised again by through()
                self.error = exc
                return

    def _run_to(self, epochs: int) -> None:
        with self._lock:
            if epochs > self.done:
                run_reference_process(str(PROJECT_ROOT / "dags" / "falkirk_figure1.py"), REFERENCE,
                                      "falkirk.spark_jobs.figure1", epochs, self.env, timeout=3600, first=self.done + 1)
                self.done = epochs

    def through(self, epochs: int) -> None:
        """Stop the turns and run the epochs up to ``epochs`` not run yet."""
        self._stop.set()
        self._thread.join()
        if self.error is not None:  # once more from the last epoch it finished: its commits are idempotent
            say(f"the failure-free run stopped beside the soak ({self.error}); running it again from epoch "
                f"{self.done + 1}")
        self._run_to(epochs)


def reference_env(cluster: Cluster, records: int) -> dict[str, str]:
    """What the failure-free run needs: the shape's store (reached directly, not through the front
    the nemesis freezes), Spark Connect, SQL sink and source."""
    store = StoreConfig(cluster.store.durable_uri, cluster.store.scratch_uri, cluster.s3.storage_options())
    return {**store.env(), "SPARK_REMOTE": cluster.connect.url if cluster.connect else "",
            "FALKIRK_QUERY_DB": cluster.query_db, RECORDS_ENV: str(records),
            "FALKIRK_CLICKSTREAM_ACKS": cluster.airflow.env()["FALKIRK_CLICKSTREAM_ACKS"]}


def check_through(cluster: Cluster, through: int) -> list[str]:
    """The differences, while the soak goes on, between its durable tables and SQL sink and the
    failure-free run's, in the epochs up to ``through`` (settled on both sides). A table the
    soak's ``falkirk gc`` collected is compared from the oldest epoch it still holds, and a state
    table only at the epochs both hold (a checkpoint at an epoch the other side skipped is no
    difference until both are collected, at the end). Read from S3 directly, not through the
    front the nemesis freezes."""
    store = StoreConfig(cluster.store.durable_uri, cluster.store.scratch_uri, cluster.s3.storage_options())
    entries = Ledger(store).entries(REFERENCE)
    states = {e.state_uri for e in entries if e.state_uri}
    durable = sorted({uri for e in entries for uri in (e.state_uri, *(o.uri for o in e.outputs))
                      if uri and not store.is_scratch(uri)})
    found = []
    for uri in durable:
        ours = _rows(store, uri.replace(f"/{REFERENCE}/", f"/{DAG_ID}/"))
        got = [r for r in ours if r["epoch"] <= through]
        want = [r for r in _rows(store, uri) if r["epoch"] <= through]
        held = {r["epoch"] for r in got}
        # From the oldest epoch the soak's table holds at all: collected through ``through``, it
        # has nothing to compare yet.
        oldest = min((r["epoch"] for r in ours), default=1)
        keep = (held & {r["epoch"] for r in want}) if uri in states else set(range(oldest, through + 1))
        got, want = [r for r in got if r["epoch"] in keep], [r for r in want if r["epoch"] in keep]
        if _canonical(got) != _canonical(want):
            found.append(f"table {uri.split(f'/{REFERENCE}/', 1)[1]}: {len(got)} rows against {len(want)}"
                         + row_differences(got, want))
    ours, theirs = ([r for r in QueryStatsStore(cluster.query_db, schema=d).rows() if r[0] <= through]
                    for d in (DAG_ID, REFERENCE))
    if ours != theirs:
        found.append(f"the SQL sink: {len(ours)} rows against {len(theirs)}")
    return found


def check(soak: Soak, reference: ReferenceBeside, progress: Progress = say) -> None:
    """Every durable table and the SQL sink against a failure-free run of the same epochs; the
    ledger whole, with no row doubled; no lease held. Both DAGs are collected first
    (``falkirk gc``), so that the soak's collections during the run leave no difference."""
    cluster, report = soak.cluster, soak.report
    store = cluster.store
    epochs = report.epochs
    if epochs > reference.done:
        progress(f"the failure-free run of epochs {reference.done + 1}-{epochs} (1-{reference.done} ran beside "
                 f"the soak)")
    reference.through(epochs)
    for dag in (DAG_ID, REFERENCE):  # the failure-free run is never broken
        env = soak.cli_env if dag == DAG_ID else {k: v for k, v in soak.cli_env.items() if k != BROKEN_ENV}
        done = subprocess.run([*soak.falkirk, "gc", "--dag", dag], env=env, capture_output=True, text=True,
                              timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"falkirk gc --dag {dag} exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    rows = Ledger(store).entries(DAG_ID)
    keys = [(r.task_id, r.epoch, r.map_index) for r in rows]
    doubled = sorted({k for k in keys if keys.count(k) > 1})
    missing = sorted({(t, e) for t in TASKS for e in range(1, epochs + 1)} - {(t, e) for t, e, _ in keys})
    report.checks.append(("no ledger row doubled", not doubled, f"{len(rows)} rows; doubled {doubled[:5]}"))
    report.checks.append(("no epoch missing", not missing, f"missing {missing[:5]}"))
    lease = open_lease(RecoveryLog(store).events(DAG_ID), DAG_ID)
    report.checks.append(("no lease held", lease is None, f"{lease}"))
    strays = stray_tables(cluster, DAG_ID)
    report.checks.append(("nothing in the store outside what the ledger names", not strays,
                          f"not named by any ledger row: {strays[:5]}"))
    durable = sorted({uri for e in Ledger(store).entries(REFERENCE) for uri in (e.state_uri, *(o.uri for o in e.outputs))
                      if uri and not store.is_scratch(uri)})
    for uri in durable:
        ours = uri.replace(f"/{REFERENCE}/", f"/{DAG_ID}/")
        want = [r for r in _rows(store, uri) if r["epoch"] <= epochs]
        got = [r for r in _rows(store, ours) if r["epoch"] <= epochs]
        name = uri.split(f"/{REFERENCE}/", 1)[1]
        report.checks.append((f"table {name}", _canonical(got) == _canonical(want),
                              f"{len(got)} rows against {len(want)}" + row_differences(got, want)))
    ours, theirs = (QueryStatsStore(cluster.query_db, schema=d) for d in (DAG_ID, REFERENCE))
    report.checks.append(("the SQL sink equals the failure-free run's", ours.rows() == theirs.rows(),
                          f"{len(ours.rows())} rows"))
    report.checks.append(("nothing delivered twice to the SQL sink", ours.duplicates() == [], ""))
    report.discrepancies += [f"{name}: {detail}" for name, ok, detail in report.checks if not ok]


def row_differences(got: list[dict], want: list[dict], shown: int = 3) -> str:
    """The rows one table has and the other has not (as many times), a few of each.

    >>> row_differences([{"epoch": 1, "n": 2}], [{"epoch": 1, "n": 2}])
    ''
    >>> row_differences([{"epoch": 1, "n": 2}, {"epoch": 1, "n": 2}], [{"epoch": 1, "n": 2}, {"epoch": 2, "n": 5}])
    '; missing: {"epoch": 2, "n": 5}; extra: {"epoch": 1, "n": 2}'
    """
    from collections import Counter

    ours, theirs = Counter(_canonical(got)), Counter(_canonical(want))
    missing, extra = sorted((theirs - ours).elements()), sorted((ours - theirs).elements())
    out = ""
    for label, rows in (("missing", missing), ("extra", extra)):
        if rows:
            out += f"; {label}: " + ", ".join(rows[:shown]) + (f" and {len(rows) - shown} more" if len(rows) > shown
                                                                 else "")
    return out


def stray_tables(cluster: Cluster, dag_id: str) -> list[str]:
    """The Delta tables of ``dag_id`` in the durable store (S3) and on the workers' disks that no
    ledger row names (rolled-back rows included: their tables are the collector's to empty)."""
    store = cluster.store
    named = {uri for e in Ledger(store).entries(dag_id, include_invalidated=True)
             for uri in (e.state_uri, *(o.uri for o in e.outputs)) if uri}
    bucket, _, prefix = store.durable_uri[len("s3://"):].partition("/")
    found: set[str] = set()
    pages = cluster.s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/{dag_id}/")
    for page in pages:
        for obj in page.get("Contents", []):
            table, sep, _ = obj["Key"].partition("/_delta_log/")
            if sep:
                found.add(f"s3://{bucket}/{table}")
    for log in Path(store.scratch_uri).glob(f"*/{dag_id}/**/_delta_log"):
        found.add(str(log.parent))
    return sorted(found - named)


def run_soak(root: Path, schedule: FaultSchedule, *, records: int = 2_000, broken: str = "",
             servers: ClusterServers | None = None, progress: Progress = say) -> SoakReport:
    """The whole soak under ``root`` (emptied first); see the module docstring. ``broken`` names
    recovery steps the shape gets wrong on purpose (:data:`falkirk.policies.faults.BROKEN`): a
    drill whose soak must end with discrepancies. ``servers``: started servers to share (the
    suite's), else the shape starts its own."""
    import shutil

    from devstack.soak.report import markdown, render

    root = root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    progress(f"soak: seed {schedule.seed}, {schedule.duration:.0f}s, {len(schedule.faults)} faults "
             f"({', '.join(f'{k} {n}' for k, n in schedule.counts().items())})")
    queues = root / "queues.json"
    queues.write_text(json.dumps({DAG_ID: "default"}))
    env = {QUEUES_ENV: str(queues), RECORDS_ENV: str(records), CRASH_ENV: f"@{root / 'crash_at'}",
           **({BROKEN_ENV: broken} if broken else {}),
           CLOCKS_ENV: str(root / "clocks"), "PYTHONPATH": str(CLOCK_DIR),  # a worker's clock can be shifted
           # a task instance on a killed worker is failed after 30 s, not Airflow's 5 minutes
           "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
           # and one a killed scheduler had queued is adopted by the next within a minute, not five
           "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30",
           "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "120"}
    started = time.monotonic()
    with Cluster(root / "shape", dags_folder=DAGS, extra_env=env, spark_connect=True, s3_front=True,
                 servers=servers) as cluster:
        progress(f"the shape is up after {time.monotonic() - started:.0f}s: Airflow at {cluster.airflow.base_url}")
        soak = Soak(cluster, schedule, root, progress, broken)
        reference = ReferenceBeside(reference_env(cluster, records), lambda: soak.latest_epoch).start()
        soak.reference = reference
        report = soak.run()
        if report.caught_up_in is not None:
            try:
                check(soak, reference, progress)
            except Exception as exc:  # noqa: BLE001 - reported with the rest, the shape still stopped
                report.discrepancies.append(f"the checks could not run: {type(exc).__name__}: {str(exc)[-2000:]}")
    text = render(report)
    (root / "report.txt").write_text(text + "\n", encoding="utf-8")
    (root / "report.md").write_text(markdown(report), encoding="utf-8")
    progress(text)
    progress(f"\nthe report: {root / 'report.txt'}; its figures for the docs: {root / 'report.md'}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="20m", help="how long faults land, e.g. 60m, 4m, 300 (default 20m)")
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a new one, printed)")
    parser.add_argument("--mix", default=",".join(SUPPORTED),
                        help="fault kinds and weights, e.g. kill-worker=2,freeze-s3=1 (default: each kind once)")
    parser.add_argument("--mean-gap", type=float, default=90, help="mean seconds between faults (default 90)")
    parser.add_argument("--records", type=int, default=2_000, help="events per epoch (default 2,000)")
    parser.add_argument("--broken", default="", metavar="STEP",
                        help=f"get a recovery step wrong on purpose, to see the soak fail: {', '.join(BROKEN)}")
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT / ".falkirk" / "soak",
                        help="where the shape keeps its databases, store, disks and logs (emptied first)")
    args = parser.parse_args(argv)
    try:
        mix = Mix.parse(args.mix)
        kinds_supported([k for k, w in mix.weights.items() if w > 0])
        faults.broken("", args.broken)  # refuses an unknown name
        duration = parse_duration(args.duration)
    except ValueError as exc:
        parser.error(str(exc).replace(f"{BROKEN_ENV}:", "--broken:"))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    schedule = FaultSchedule.draw(seed, duration, mix, mean_gap=args.mean_gap)
    report = run_soak(args.root, schedule, records=args.records, broken=args.broken)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
