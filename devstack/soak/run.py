"""``make soak``: continuous epochs on the distributed shape while a seeded schedule of faults
lands, recovered as a user would, then every table compared with a failure-free run.

1. starts the shape (:class:`devstack.cluster.Cluster`: PostgreSQL, Redis, the S3-compatible
   server behind a front that can freeze or refuse, a Spark standalone cluster behind a Spark
   Connect server, Airflow with the CeleryExecutor and two workers with their own disks);
2. triggers epochs of every DAG of ``--dags`` side by side (:mod:`devstack.soak.pipelines`:
   ``falkirk_figure1``'s four regimes and exactly-once SQL sink, partitions, checkpoints inside
   an epoch, sender-side logs, marker pairs, process pairs), each one epoch after another with a
   few in flight,
   the others at most two epochs ahead of falkirk_figure1, for
   ``--duration``;
3. meanwhile injects the faults :class:`~devstack.soak.schedule.FaultSchedule` drew from the
   seed (:mod:`devstack.soak.nemesis`), and after each does what a user would, DAG by DAG
   (:class:`DagUnderSoak`): a DAG run that failed is planned (``falkirk plan --failed-task``,
   with ``--lost-worker`` for a worker that lost its disk), an input batch delivered again
   whole is planned as a bad epoch (``--bad-epoch events:E``), and the plan is replayed
   (``falkirk replay``; a killed replay is run again; a plan refused as stale because runs
   kept committing is planned again with no new epoch triggered until a replay gets past that
   check, as a user lets the runs in flight finish first). ``falkirk watch`` runs beside the
   shape (:class:`Watcher`): for a lost worker it takes its process pairs over, plans the
   recovery, and replays it for the DAGs that opt in; once a new machine took the lost
   worker's name, the replicas taken over are caught up onto it (``falkirk pairs --catch-up
   --spare W --replaced``);
4. meanwhile runs the same epochs failure-free in a process beside it
   (:mod:`devstack.inprocess`, :class:`ReferenceBeside`);
5. stops triggering, recovers until every epoch's run succeeded (the time to caught-up),
   collects both copies of each DAG and compares every durable table and the SQL sink with
   the failure-free run's, row for row, then checks that no ledger row is doubled, no epoch
   is missing, no lease is held and no table in the store is outside what the ledger names;
   (and along the way, every ten minutes or half a shorter soak: the rows of the epochs
   settled so far, :func:`check_through`);
6. prints the report (:mod:`devstack.soak.report`, also written to ``report.txt`` and, its
   figures as Markdown, ``report.md``): the faults by kind with their times to caught-up, each
   fault's landing and recoveries, the discrepancies with the rows that differ, and the
   command that draws the same schedule again.

Exit code 0 when nothing differs, 1 otherwise. ``--broken`` (``FALKIRK_BROKEN``) gets a step
recovery relies on wrong on purpose, for a soak that must fail.

    make soak DURATION=20m SEED=7
    make soak DURATION=4m DAGS=figure1,loops
    .venv/bin/python -m devstack.soak.run --duration 4m --seed 7 --mix kill-worker=2,gc=1
    make soak BROKEN=gc-watermark SEED=8 DURATION=4m MIX=kill-job=1,gc=1 MEAN_GAP=40
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devstack.airflow import PROJECT_ROOT
from devstack.cluster import Cluster, ClusterServers
from devstack.cluster_demo import Progress, _canonical, _rows, say
from devstack.inprocess import run_reference_process
from devstack.processes import VENV_BIN
from devstack.soak.nemesis import CLOCK_DIR, CLOCKS_ENV, SUPPORTED, Injected, Nemesis, ensure_file, kinds_supported
from devstack.soak.pipelines import AUTO_RECOVER_ENV, DAGS_ENV, SOAK_DAGS, SoakDag, dags_named
from devstack.soak.schedule import FaultSchedule, Mix, parse_duration
from falkirk.plugins.airflow_rest import api_path
from falkirk.plugins.cli import EXIT_STORE
from falkirk.policies import EpochClock, faults
from falkirk.policies.asset_events import EPOCH_KEY_FORMAT
from falkirk.policies.faults import BROKEN, BROKEN_ENV, CRASH_ENV
from falkirk.policies.ids import ProcessorId
from falkirk.policies.pairs import Layout, Status
from falkirk.policies.planning.monitor import inputs_to_reopen
from falkirk.policies.planning.recovery_log import RecoveryLog, live_lease, open_lease
from falkirk.policies.regimes import Tier
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import open_table
from falkirk.policies.store.control import Collections, PairLayouts
from falkirk.policies.store.ledger import EXTERNAL_SCHEME, Ledger
from falkirk.policies.store.readability import StoreReadability, durable_only
from falkirk.policies.store.steps import StepLog
from falkirk.spark_jobs.figure1 import GRAPH
from falkirk.spark_jobs.figure1.data import RECORDS_ENV
from falkirk.spark_jobs.figure1.query_store import QueryStatsStore
from falkirk.spark_jobs.figure1.source import ClickstreamSource

IN_FLIGHT = 2  # epochs triggered and not finished, at most
LEAD = 2  # epochs another DAG may be ahead of falkirk_figure1, at most
STALE_PLAN = "the ledger changed since the plan was computed"  # falkirk replay's refusal of a stale plan
RETRY_SECONDS = 15  # a replay stopped by an unreachable store or a held lease is run again after this
CHECK_EVERY = 600  # seconds between the checks along the way (half a shorter soak)
SOAK_DAG_FOLDER = Path(__file__).with_name("dags")  # the Airflow DAG file that builds the DAGs of DAGS_ENV


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
    dag_id: str = "falkirk_figure1"
    also: list[str] = field(default_factory=list)  # the plans of the consumer DAGs replayed with it


@dataclass
class SoakReport:
    schedule: FaultSchedule
    injected: list[Injected] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    dags: list[str] = field(default_factory=lambda: ["falkirk_figure1"])  # the DAGs run side by side
    epochs: dict[str, int] = field(default_factory=dict)  # each DAG's epochs triggered
    caught_up_in: float | None = None
    discrepancies: list[str] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    # (at, each DAG's last epoch checked, differences)
    along_the_way: list[tuple[float, dict[str, int], int]] = field(default_factory=list)
    broken: str = ""  # the recovery steps broken on purpose (FALKIRK_BROKEN), if any
    # Where the shape kept its tables, as the S3 server itself serves them (not through the front
    # the faults stop): its buckets and worker disks outlive the shape.
    store: StoreConfig | None = None

    @property
    def ok(self) -> bool:
        return self.caught_up_in is not None and not self.discrepancies


class Soak:
    """One soak on a started shape: the loop that keeps every DAG's epochs running, injects the
    faults and recovers from them (each DAG as :class:`DagUnderSoak`)."""

    def __init__(self, cluster: Cluster, schedule: FaultSchedule, root: Path, progress: Progress = say,
                 broken: str = "", dags: list[SoakDag] | None = None) -> None:
        self.cluster = cluster
        assert cluster.front is not None, "the soak's shape has the S3 front (s3_front=True)"
        self.front = cluster.front
        self.schedule = schedule
        self.progress = progress
        self.client = cluster.airflow.client()
        self.crash_file = ensure_file(root / "crash_at")
        self.clocks = root / "clocks"  # each worker's clock shift (devstack/soak/clock/sitecustomize.py)
        self.kill_next_replay = False  # a kill-replay found no replay running: the next one to start dies
        self.ending = False  # the duration is reached: no more epochs are triggered
        self.reference: ReferenceBeside | None = None  # the failure-free run, for the checks along the way
        self.check_every = min(CHECK_EVERY, schedule.duration / 2)
        self._next_check = self.check_every
        self.falkirk = [str(VENV_BIN / "falkirk")]
        self.cli_env = {**os.environ, **cluster.store.env(), "FALKIRK_AIRFLOW_URL": cluster.airflow.base_url,
                        "FALKIRK_AIRFLOW_USER": "admin", "FALKIRK_AIRFLOW_PASSWORD": "admin",
                        **({BROKEN_ENV: broken} if broken else {})}
        self.report = SoakReport(schedule, broken=broken, store=replace(
            cluster.store, storage_options=cluster.s3.storage_options()))
        self.dags = [DagUnderSoak(self, dag) for dag in (dags or [SOAK_DAGS["figure1"]])]
        self.report.dags = [d.dag_id for d in self.dags]
        self.inputs = self.dags[0]  # falkirk_figure1: its clickstream is the source bad-input spoils
        self.nemesis = Nemesis(self, random.Random(schedule.seed))
        self._started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def run(self, catch_up_timeout: float = 1800) -> SoakReport:
        for driven in self.dags:
            self.client.wait_for_dag(driven.dag_id)
            self.client.set_paused(driven.dag_id, False)
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
        self.progress(f"{self.elapsed():6.0f}s  duration reached at epochs {self._latest()}; catching up")
        ended = self.elapsed()
        deadline = time.monotonic() + catch_up_timeout
        while not all(d.caught_up() for d in self.dags):
            if time.monotonic() > deadline:
                self.report.discrepancies += [f"{d.dag_id}: not caught up {catch_up_timeout:.0f}s after the last "
                                              f"epoch: {d.states()}" for d in self.dags if not d.caught_up()]
                break
            self._tick(trigger=False)
        else:
            self.report.caught_up_in = self.elapsed() - ended
        self.report.epochs = {d.dag_id: d.latest_epoch for d in self.dags}
        return self.report

    def _latest(self) -> str:
        return ", ".join(f"{d.dag_id} {d.latest_epoch}" for d in self.dags)

    def _postponed(self, fault) -> bool:  # noqa: ANN001
        """A ``gc`` waits while a batch is known to be incomplete and its recovery has not replayed:
        collecting below that epoch would leave its recovery nothing to restore but the empty
        state, and the source has forgotten the input a recovery from there reads. A team told
        that a batch will be delivered again collects only once it is recovered."""
        return fault.kind == "gc" and bool(self.inputs.spoiled or self.inputs.delivered_again)

    def _not_landed(self, fault, why: str) -> None:  # noqa: ANN001
        self._report(Injected(fault, self.elapsed(), f"not landed: {why}"))

    def _inject(self, fault) -> None:  # noqa: ANN001
        try:
            injected = self.nemesis.inject(fault)
        except Exception as exc:  # noqa: BLE001 - a fault that could not land is reported, not fatal
            injected = Injected(fault, self.elapsed(), f"could not inject: {exc}")
        self._report(injected)
        if fault.kind == "bad-input" and not injected.hit.startswith("could not"):
            injected.epoch, injected.settled = self.inputs.latest_epoch + 1, False
            self.inputs.spoiled[injected.epoch] = injected

    def _report(self, injected: Injected) -> None:
        injected.epoch = self.inputs.latest_epoch
        injected.reached = {d.dag_id: d.latest_epoch for d in self.dags}
        self.report.injected.append(injected)
        self.progress(f"{self.elapsed():6.0f}s  FAULT {injected.line()}")

    def _tick(self, trigger: bool) -> None:
        """One turn of the loop: keep every DAG's epochs flowing, recover what failed."""
        runs: dict[str, list[dict[str, Any]]] = {}
        for driven in self.dags:
            try:
                runs[driven.dag_id] = driven.runs()
                if trigger:
                    driven.trigger(runs[driven.dag_id])
                driven.recover(runs[driven.dag_id])
            except Exception as exc:  # noqa: BLE001 - Airflow or the store is down for a moment: next tick
                self.progress(f"{self.elapsed():6.0f}s  ({driven.dag_id} tick: {type(exc).__name__}: "
                              f"{str(exc)[:200]})")
        if len(runs) == len(self.dags):
            self._note_caught_up(runs)
            if trigger and self.elapsed() >= self._next_check:
                try:
                    self._check_along_the_way(runs)
                except Exception as exc:  # noqa: BLE001 - the store is down for a moment: the next tick
                    self.progress(f"{self.elapsed():6.0f}s  (check along the way: {type(exc).__name__}: "
                                  f"{str(exc)[:200]})")
        time.sleep(1)

    def _note_caught_up(self, runs: dict[str, list[dict[str, Any]]]) -> None:
        """Each fault's time to caught-up: until every epoch triggered before it landed, in every
        DAG, succeeded."""
        state = {d.dag_id: d.epoch_states(runs[d.dag_id]) for d in self.dags}
        for injected in self.report.injected:
            if injected.caught_up_in is None and injected.settled \
                    and all(state[dag].get(e) == "success" for dag, latest in injected.reached.items()
                            for e in range(1, latest + 1)):
                injected.caught_up_in = self.elapsed() - injected.landed

    def _check_along_the_way(self, runs: dict[str, list[dict[str, Any]]]) -> None:
        """Every ``check_every`` seconds: each DAG's durable tables (and figure1's SQL sink) up to
        its last epoch settled on both sides (:func:`check_through`)."""
        if self.reference is None:
            return
        last = self.report.along_the_way[-1][1] if self.report.along_the_way else {}
        through = {d.dag_id: min(d.settled_through(runs[d.dag_id]), self.reference.done[d.dag_id])
                   for d in self.dags}
        if not any(n > last.get(dag, 0) for dag, n in through.items()):
            return
        found = [f for d in self.dags if through[d.dag_id] for f in check_through(self.cluster, d.dag,
                                                                                   through[d.dag_id])]
        self.report.along_the_way.append((self.elapsed(), through, len(found)))
        self.report.discrepancies += [f"at {self.elapsed():.0f}s: {d}" for d in found]
        self.progress(f"{self.elapsed():6.0f}s  checked {', '.join(f'{d} 1-{n}' for d, n in through.items())} "
                      "against the failure-free run: " + (f"{len(found)} DIFFER: {found[0][:300]}" if found
                                                          else "equal"))
        self._next_check = self.elapsed() + self.check_every


class DagUnderSoak:
    """One DAG of a :class:`Soak`: its epochs triggered a few at a time, and what a user does
    when one fails (a DAG run that failed is planned, ``--lost-worker`` for a worker that lost
    its disk, and replayed; figure1's batch delivered again is planned as a bad epoch)."""

    def __init__(self, soak: Soak, dag: SoakDag) -> None:
        self.soak, self.dag, self.dag_id = soak, dag, dag.dag_id
        self.client = soak.client
        self.clock: EpochClock = dag.module.EPOCHS
        self.latest_epoch = 0
        self.lost_workers: set[str] = set()
        self.replay: subprocess.Popen[str] | None = None
        self.replaying: Recovery | None = None
        self.replay_due: tuple[Recovery, float] | None = None  # a replay to run again, and when
        # A plan went stale before its replay began (runs kept committing): no new epochs until a
        # replay ends otherwise, as a user lets the runs in flight finish before planning again.
        self.holding = False
        self.mistaken: list[str] = []
        self._attributed = 0  # the faults before this index are named by a plan of this DAG already
        # figure1 only: its clickstream, the epochs delivered incomplete and not delivered again yet,
        # and those delivered again whose recovery has not replayed yet.
        self.source = ClickstreamSource(soak.cluster.airflow.env()["FALKIRK_CLICKSTREAM_ACKS"]
                                        .replace("{dag_id}", self.dag_id)) if dag.name == "figure1" else None
        self.spoiled: dict[int, Injected] = {}
        self.delivered_again: dict[int, Injected] = {}
        # process pairs only: the catch-up under way (falkirk pairs --catch-up), and one to run
        # again after it stopped part-way (onto which worker, and when)
        self.catching_up: tuple[subprocess.Popen[str], Recovery, str] | None = None
        self.catch_up_due: tuple[str, float] | None = None

    def runs(self) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = []
        while True:
            page = self.client.request("GET", api_path("dags", self.dag_id, "dagRuns"),
                                       params={"limit": 100, "offset": len(runs), "order_by": "run_after"})
            runs += page["dag_runs"]
            if not page["dag_runs"] or len(runs) >= page["total_entries"]:
                if self.dag.fed is not None:  # started by asset events: each names its epoch by partition key
                    return [r for r in runs if r.get("partition_key")]
                return [r for r in runs if r["dag_run_id"].startswith("epoch-")]

    def epoch_of(self, run: dict[str, Any]) -> int:
        """The epoch of one of :meth:`runs`: ``epoch-N`` as the soak triggered it, or for a DAG
        on an Asset, the epoch its partition key names."""
        if self.dag.fed is None:
            return int(run["dag_run_id"].split("-", 1)[1])
        return self.clock.epoch_of(datetime.strptime(run["partition_key"], EPOCH_KEY_FORMAT).replace(
            tzinfo=UTC))

    def epoch_states(self, runs: list[dict[str, Any]]) -> dict[int, str]:
        """Each epoch's state: its run's, or where Airflow started several runs of one epoch (an
        asset event and its replacement after a redo), success only when all succeeded."""
        states: dict[int, set[str]] = {}
        for run in runs:
            states.setdefault(self.epoch_of(run), set()).add(run["state"])
        return {e: "success" if found == {"success"} else "failed" if "failed" in found else "running"
                for e, found in states.items()}

    def states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for run in self.runs():
            counts[run["state"]] = counts.get(run["state"], 0) + 1
        return counts

    def trigger(self, runs: list[dict[str, Any]]) -> None:
        if self.dag.fed is not None:  # Airflow starts its runs, on its producer's epochs
            self.latest_epoch = self.producer.latest_epoch
            return
        if any(r["state"] == "failed" for r in runs):
            return  # a user recovers before asking for more
        in_flight = sum(r["state"] in ("queued", "running") for r in runs)
        if self.holding and not in_flight and self.replay is None and self.replay_due is None:
            # The runs in flight when a plan went stale have ended and none failed (falkirk
            # watch, or a replay of the DAG's producer, recovered them): nothing is left to plan.
            self.holding = False
        if self.holding or in_flight >= IN_FLIGHT:
            return
        if self is not self.soak.inputs and self.latest_epoch >= self.soak.inputs.latest_epoch + LEAD:
            return  # the cheaper DAGs keep figure1's pace: the shape's two workers serve them all
        epoch = self.latest_epoch + 1
        self.client.trigger(self.dag_id, f"epoch-{epoch}", self.clock.logical_date(epoch))
        self.latest_epoch = epoch

    def recover(self, runs: list[dict[str, Any]]) -> None:
        """What a user does: a replay that was killed is run again; a failed run, or a batch
        delivered again, is planned and replayed; replicas taken over are caught up."""
        soak = self.soak
        recovery: Recovery | None
        if self.dag.paired and self._catch_up():
            return
        if self.dag.fed is not None and (self.producer.replay is not None or self.producer.replay_due is not None):
            return  # the producer's plan was made with its consumers: its replay recovers this DAG too
        if self.replay_due is not None:
            recovery, due = self.replay_due
            if soak.elapsed() >= due:
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
                recovery.replayed_in = soak.elapsed() - recovery.planned_at
                self._say(f"replay {recovery.plan_id} done in {recovery.replayed_in:.0f}s")
                self.lost_workers.clear()
                for epoch in recovery.bad_epochs:
                    self.delivered_again.pop(epoch).settled = True
                if recovery.bad_epochs and not self.delivered_again and self.source is not None:
                    self.source.recovered()
                self.replaying = None
                return
            said = output.strip().splitlines()[-1][:200] if output.strip() else "no output"
            if code < 0 or "cannot reach Airflow" in said:  # killed, or Airflow was: a user runs it again
                why = f"killed ({code})" if code < 0 else "stopped: Airflow was unreachable"
                self._say(f"replay {recovery.plan_id} {why}: running it again")
                self._start_replay(recovery)
                return
            if code == EXIT_STORE or "is being recovered by plan" in said:
                # The store did not answer, or a replay that stopped while it did not still holds
                # the lease (it could not release it): as the message says, a user waits a little
                # and runs the replay again.
                why = "the store was unreachable" if code == EXIT_STORE else "another plan's lease is held"
                self._say(f"replay {recovery.plan_id} stopped ({why}): running it again in {RETRY_SECONDS}s")
                self.replay_due = (recovery, soak.elapsed() + RETRY_SECONDS)
                return
            # It stopped on a failure it names (another fault's): the next tick plans again, from
            # every failed task instance, as a user reading that message would.
            self._say(f"replay {recovery.plan_id} ended {code}: {said}")
            self.replaying = None
            return
        failed = {ti["task_id"] for ti in self._failed_task_instances()} | self._stranded(runs)
        self._deliver_again(runs)
        bad = sorted(self.delivered_again)
        if not failed and not bad:
            return
        args = ["plan", "--dag", self.dag_id, "--json", *(a for t in sorted(failed) for a in ("--failed-task", t)),
                *(a for w in sorted(self.lost_workers) for a in ("--lost-worker", w)),
                *(a for e in bad for a in ("--bad-epoch", f"events:{e}")),
                # A producer's recovery takes in the runs of its consumers it leaves stale; a
                # consumer's, the reads of a producer epoch a recovery there redid.
                *(["--consumers"] if self.consumers else []), *(["--stale-inputs"] if self.dag.fed else [])]
        done = subprocess.run([*soak.falkirk, *args], env=soak.cli_env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()
            self._say(f"falkirk {' '.join(args)} exited {done.returncode}: {said[-300:]}")
            # A lost worker that held none of the DAG's scratch data changes nothing: as the
            # message says, a user plans again without it.
            self.lost_workers -= {w for w in self.lost_workers if f"--lost-worker {w!r}" in said
                                  and "changes nothing" in said}
            return
        plans = json.loads(done.stdout)
        plans = plans.get("plans", [plans])  # --consumers: this DAG's plan first, then its consumers'
        plan = plans[0]
        reasons = [f"failed: {', '.join(sorted(failed))}"] if failed else []
        reasons += [f"lost: {', '.join(sorted(self.lost_workers))}"] if self.lost_workers else []
        reasons += [f"delivered again: events {', '.join(map(str, bad))}"] if bad else []
        recovery = next((r for r in soak.report.recoveries if r.plan_id == plan["plan_id"] and r.replayed_in is None),
                        None)  # the same plan again (nothing changed since): one recovery, replayed again
        if recovery is None:
            also = [p["plan_id"] for p in plans[1:]]
            reasons += [f"with {', '.join(p['dag_id'] for p in plans[1:])}"] if also else []
            recovery = Recovery(plan["plan_id"], sum(len(t["rerun"]) for p in plans for t in p["tasks"]),
                                soak.elapsed(), "; ".join(reasons), bad_epochs=bad, dag_id=self.dag_id, also=also)
            soak.report.recoveries.append(recovery)
        for injected in soak.report.injected[self._attributed:]:  # the faults since this DAG's last plan
            if injected.settled or injected.epoch in bad:  # a spoiled input waits for its own plan
                injected.recoveries.append(recovery.plan_id)
        for epoch in bad:
            if recovery.plan_id not in self.delivered_again[epoch].recoveries:
                self.delivered_again[epoch].recoveries.append(recovery.plan_id)
        self._attributed = len(soak.report.injected)
        self._say(f"plan {recovery.plan_id}: {recovery.reruns} re-runs ({recovery.why})")
        self._start_replay(recovery)

    @property
    def producer(self) -> DagUnderSoak:
        """The soak DAG whose task updates the Asset this one is scheduled on."""
        assert self.dag.fed is not None
        return next(d for d in self.soak.dags if d.dag.name == self.dag.fed.producer)

    @property
    def consumers(self) -> list[DagUnderSoak]:
        """The soak DAGs scheduled on an Asset this one updates."""
        return [d for d in self.soak.dags if d.dag.fed is not None and d.dag.fed.producer == self.dag.name]

    def _say(self, message: str) -> None:
        self.soak.progress(f"{self.soak.elapsed():6.0f}s  {self.dag_id}: {message}")

    def _layout(self) -> Layout | None:
        return PairLayouts(_direct(self.soak.cluster)).load(self.dag_id)

    def _catch_up(self) -> bool:
        """Process pairs: once ``falkirk watch`` took a lost worker's replicas over and a new
        machine took its name, a user recreates them there (``falkirk pairs --catch-up --spare W
        --replaced``); one that stops part-way is run again. Returns whether one is under way.
        A partition that lost both replicas is not caught up: its readers fail, and the plan of
        their failure restores it on the durable path."""
        soak = self.soak
        if self.catching_up is not None:
            proc, recovery, caught = self.catching_up
            code = proc.poll()
            if code is None:
                return True
            self.catching_up = None
            said = (proc.stdout.read() if proc.stdout else "").strip()
            if code == 0:
                recovery.replayed_in = soak.elapsed() - recovery.planned_at
                recovery.reruns = sum(len(m.group(1).split(", ")) for m in CATCH_UP_REPLAYING.finditer(said)
                                      if m.group(1) != "none")
                self._say(f"catch-up onto {caught} done in {recovery.replayed_in:.0f}s "
                          f"({recovery.reruns} epochs of replicas to replay)")
            else:
                self._say(f"catch-up onto {caught} exited {code}: {(said.splitlines() or [''])[-1][:200]}; "
                          f"running it again in {RETRY_SECONDS}s")
                self.catch_up_due = (caught, soak.elapsed() + RETRY_SECONDS)
            return False
        if self.replay is not None or self.replay_due is not None:
            return False
        worker = None
        if self.catch_up_due is not None:
            if soak.elapsed() < self.catch_up_due[1]:
                return False
            worker, self.catch_up_due = self.catch_up_due[0], None
        else:
            layout = self._layout()
            if layout is None:
                return False
            lost = set(layout.lost_partitions())
            dead = sorted({r.worker for r in layout.replicas
                           if r.status is Status.DEAD and (r.task, r.partition) not in lost})
            worker = next((w for w in dead if soak.nemesis.running(w)), None)
            if worker is None:
                return False
        recovery = Recovery(f"catch-up:{worker}", 0, soak.elapsed(), f"pairs taken over on {worker}: caught up "
                            f"onto the new {worker}", dag_id=self.dag_id, attempts=1)
        soak.report.recoveries.append(recovery)
        for injected in reversed(soak.report.injected):
            if injected.fault.kind in ("lose-worker", "kill-worker") and injected.fault.target == worker:
                injected.recoveries.append(recovery.plan_id)
                break
        self._say(f"catching up the replicas taken over on {worker}: falkirk pairs --catch-up --spare {worker} "
                  f"--replaced")
        proc = subprocess.Popen([*soak.falkirk, "pairs", "--dag", self.dag_id, "--catch-up", "--spare", worker,
                                 "--replaced"], env=soak.cli_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        self.catching_up = (proc, recovery, worker)
        return True

    def pairs_whole(self) -> bool:
        """Every replica of every pair active, and no catch-up under way (or a DAG without pairs)."""
        if not self.dag.paired:
            return True
        if self.catching_up is not None or self.catch_up_due is not None:
            return False
        layout = self._layout()
        return layout is None or all(r.status is Status.ACTIVE for r in layout.replicas)

    def settled_through(self, runs: list[dict[str, Any]]) -> int:
        """The last epoch whose rows are final for now: every run up to it succeeded, no replay is
        under way, and no input up to it waits to be delivered again or recovered."""
        if self.replay is not None or self.replay_due is not None or not self.pairs_whole():
            return 0  # (a replica taken over has not caught up yet: its tables lack epochs)
        state = self.epoch_states(runs)
        waiting = min([*self.spoiled, *self.delivered_again], default=self.latest_epoch + 1)
        through = 0
        while through + 1 < waiting and state.get(through + 1) == "success":
            through += 1
        return through

    def _deliver_again(self, runs: list[dict[str, Any]]) -> None:
        """Upstream delivers each incomplete batch again, whole, once its epoch succeeded and two
        later epochs were triggered (read on from it); the user then plans it as a bad epoch."""
        state = self.epoch_states(runs)
        for epoch in sorted(self.spoiled):
            if self.soak.ending and epoch > self.latest_epoch:  # the soak ended before any run read it
                injected = self.spoiled.pop(epoch)
                injected.hit = f"not landed: epoch {epoch}, the batch it spoiled, was never run (the soak ended first)"
                injected.settled = True
                self._say(f"clickstream epoch {epoch} was spoiled after the last epoch: nothing read it")
                continue
            if self.source is not None and state.get(epoch) == "success" and (
                    self.latest_epoch >= epoch + 2 or self.soak.ending):
                self.source.deliver_again(epoch, reopen_from=self._reopen_from(epoch))
                self.delivered_again[epoch] = self.spoiled.pop(epoch)
                self._say(f"clickstream epoch {epoch} delivered again, whole")

    def _reopen_from(self, epoch: int) -> int:
        """How far back upstream holds the clickstream again for the recovery of ``epoch``: as far
        as the checkpoints before it roll back to once every scratch copy is lost (a worker lost
        while the recovery runs), not just the window the first plan reads."""
        store = _direct(self.soak.cluster)
        readable = durable_only(StoreReadability(store), store.scratch_uri)
        return inputs_to_reopen(Ledger(store).entries(self.dag_id), readable, epoch, GRAPH)[ProcessorId(task="events")]

    def _start_replay(self, recovery: Recovery) -> None:
        recovery.attempts += 1
        self.replaying = recovery
        self.replay = subprocess.Popen([*self.soak.falkirk, "replay", recovery.plan_id, *recovery.also],
                                       env=self.soak.cli_env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if self.soak.kill_next_replay:
            self.soak.kill_next_replay = False
            time.sleep(3)
            if self.replay.poll() is None:
                self.replay.kill()
                self.soak.progress(f"{self.soak.elapsed():6.0f}s  FAULT kill-replay landed on {self.dag_id}'s "
                                   f"replay {recovery.plan_id}")
            else:  # it ended within the 3 s: the next replay is killed instead
                self.soak.kill_next_replay = True

    def _stranded(self, runs: list[dict[str, Any]]) -> set[str]:
        """``task:epoch`` of the instances a failed DAG run holds that never started (a run failed
        with nothing failed in it: the Grid shows them without a state): a user plans them too."""
        stranded = set()
        for run in runs:
            if run["state"] != "failed":
                continue
            tis = self.client.task_instances(self.dag_id, run["dag_run_id"])
            if not any(ti.get("state") == "failed" for ti in tis.values()):
                stranded |= {f"{t}:{self.epoch_of(run)}" for t, ti in tis.items()
                             if ti.get("state") in (None, "upstream_failed")}
        return stranded

    def _failed_task_instances(self) -> list[dict[str, Any]]:
        data = self.client.request("GET", api_path("dags", self.dag_id, "dagRuns", "~", "taskInstances"),
                                   params={"state": "failed", "limit": 100})
        return data["task_instances"]

    def caught_up(self) -> bool:
        runs = self.runs()
        states = self.epoch_states(runs)
        return (self.replay is None and self.replay_due is None and not self.spoiled and not self.delivered_again
                and all(states.get(e) == "success" for e in range(1, self.latest_epoch + 1))
                and all(r["state"] == "success" for r in runs)
                and self.pairs_whole()
                # and no replay of falkirk watch's still holds the DAG
                and not (self.dag.auto_recover
                         and live_lease(RecoveryLog(_direct(self.soak.cluster)).events(self.dag_id), self.dag_id)))


# What falkirk watch says as it replays a plan (plugins/watch.py, plugins/recovery.py):
WATCH_REPLAYING = re.compile(r"(\S+): replaying plan (\w+) for the lost worker (\S+)")
WATCH_DONE = re.compile(r"plan (\w+): done, (\d+) task instances re-ran")
# What falkirk pairs --catch-up says of each replica it recreated (plugins/pairs.py)
CATCH_UP_REPLAYING = re.compile(r"replaying epochs ([\d, ]+|none)")


class Watcher:
    """``falkirk watch`` beside the soak for every DAG, as an operator runs it beside the
    scheduler: it notices a lost worker by its silence, plans its recovery for each DAG, and
    replays it where the DAG opted in (:attr:`SoakDag.auto_recover`). Its output goes to
    ``watch.log`` and to the progress; each replay it starts is a recovery in the report."""

    TIMEOUT, POLL = 15, 3  # a worker silent for 15 s is lost; pinged every 3 s

    def __init__(self, soak: Soak, log: Path) -> None:
        self.soak, self.log = soak, log
        env = {**soak.cluster.airflow.env(), "FALKIRK_AIRFLOW_URL": soak.cluster.airflow.base_url,
               "FALKIRK_AIRFLOW_USER": "admin", "FALKIRK_AIRFLOW_PASSWORD": "admin",
               **({BROKEN_ENV: soak.report.broken} if soak.report.broken else {})}
        self.proc = subprocess.Popen([*soak.falkirk, "watch", *(a for d in soak.dags for a in ("--dag", d.dag_id)),
                                      "--timeout", str(self.TIMEOUT), "--poll", str(self.POLL)], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._thread = threading.Thread(target=self._read, name="watch", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("a", encoding="utf-8") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                self.heard(line.strip())

    def heard(self, line: str) -> None:
        """One line of the watch's output: report what a person would want to know of."""
        soak = self.soak
        replaying, done = WATCH_REPLAYING.match(line), WATCH_DONE.match(line)
        if replaying:
            dag_id, plan_id, worker = replaying.groups()
            recovery = Recovery(plan_id, 0, soak.elapsed(), f"falkirk watch: lost {worker}", dag_id=dag_id)
            soak.report.recoveries.append(recovery)
            lost = [i for i in soak.report.injected if i.fault.kind == "lose-worker" and i.fault.target == worker]
            if lost:
                lost[-1].recoveries.append(plan_id)
        elif done:
            for recovery in soak.report.recoveries:
                if recovery.plan_id == done.group(1) and recovery.why.startswith("falkirk watch"):
                    recovery.reruns = int(done.group(2))
                    recovery.replayed_in = soak.elapsed() - recovery.planned_at
        if replaying or done or "has not answered" in line or "could not respond" in line:
            soak.progress(f"{soak.elapsed():6.0f}s  {line}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._thread.join(10)


class ReferenceBeside:
    """The failure-free runs, made beside the soak in processes of their own: every ``every``
    seconds each DAG's copy runs the epochs triggered since its last turn, so that at the end only
    the last few are left to run (:meth:`through`)."""

    def __init__(self, env: dict[str, str], soak: Soak, every: float = 45) -> None:
        self.env, self.soak, self.every = env, soak, every
        self.done: dict[str, int] = {d.dag_id: 0 for d in soak.dags}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="reference", daemon=True)

    def start(self) -> ReferenceBeside:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                for driven in self.soak.dags:
                    self._run_to(driven.dag, driven.latest_epoch)
            except BaseException as exc:  # noqa: BLE001 - raised again by through()
                self.error = exc
                return

    def _run_to(self, dag: SoakDag, epochs: int) -> None:
        if dag.fed is not None:  # no further than its producer's copy has committed
            epochs = min(epochs, self.done[SOAK_DAGS[dag.fed.producer].dag_id])
        with self._lock:
            if not dag.compared:  # nothing to run: its checks need no copy
                self.done[dag.dag_id] = max(self.done[dag.dag_id], epochs)
            elif epochs > self.done[dag.dag_id]:
                # a consumer's copy reads its producer's copy, which ran these epochs before it
                consumes = {dag.fed.asset: (SOAK_DAGS[dag.fed.producer].reference, dag.fed.task)} if dag.fed else None
                run_reference_process(str(dag.dag_file), dag.reference, dag.package, epochs,
                                      {**self.env, **dag.env}, timeout=3600, first=self.done[dag.dag_id] + 1,
                                      consumes=consumes)
                self.done[dag.dag_id] = epochs

    def through(self, epochs: dict[str, int]) -> None:
        """Stop the turns and run each DAG's epochs up to ``epochs[dag_id]`` not run yet."""
        self._stop.set()
        self._thread.join()
        if self.error is not None:  # once more from the last epoch it finished: its commits are idempotent
            say(f"the failure-free run stopped beside the soak ({self.error}); running it again from "
                f"{', '.join(f'{d} {n + 1}' for d, n in self.done.items())}")
        for driven in self.soak.dags:
            self._run_to(driven.dag, epochs[driven.dag_id])


def reference_env(cluster: Cluster, records: int) -> dict[str, str]:
    """What the failure-free runs need: the shape's store (reached directly, not through the front
    the nemesis freezes), Spark Connect, SQL sink and source."""
    return {**_direct(cluster).env(), "SPARK_REMOTE": cluster.connect.url if cluster.connect else "",
            "FALKIRK_QUERY_DB": cluster.query_db, RECORDS_ENV: str(records),
            "FALKIRK_CLICKSTREAM_ACKS": cluster.airflow.env()["FALKIRK_CLICKSTREAM_ACKS"]}


def _direct(cluster: Cluster) -> StoreConfig:
    """The shape's store reached directly, not through the front the nemesis freezes."""
    return StoreConfig(cluster.store.durable_uri, cluster.store.scratch_uri, cluster.s3.storage_options())


def _durable_tables(store: StoreConfig, dag: SoakDag) -> list[str]:
    """The failure-free copy's durable tables: the soak's have the same paths under its DAG id.
    A Delta table in the store that a task delivers to (an external output: process pairs' sink)
    is one of them."""
    named = {uri.removeprefix(EXTERNAL_SCHEME) for e in Ledger(store).entries(dag.reference)
             for uri in (e.state_uri, *(o.uri for o in e.outputs)) if uri}
    return sorted(uri for uri in named if store.contains(uri) and not store.is_scratch(uri))


def collectable(store: StoreConfig, dag_id: str, through: int) -> dict[str, set[int]]:
    """Per table of ``dag_id``, the epochs up to ``through`` that its collections may have
    deleted: those ``falkirk gc`` would collect now (low-watermarks only rise, so every earlier
    collection deleted fewer). A producer's output goes by its readers' watermarks, which may
    pass the producer's own: ``falkirk_regions``' ``clean`` output was collected through epoch
    15 while ``clean``'s own collection stood at 14."""
    from falkirk.policies.planning.collector import _plan

    plan = _plan(store, Ledger(store), dag_id, None, None, live=lambda uri: dict.fromkeys(range(1, through + 1), 0))
    return {r.uri: set(r.epochs) for r in plan.tables}


def check_through(cluster: Cluster, dag: SoakDag, through: int) -> list[str]:
    """The differences, while the soak goes on, between ``dag``'s durable tables (and figure1's SQL
    sink) and the failure-free run's, in the epochs up to ``through`` (settled on both sides). A
    table the soak's ``falkirk gc`` collected is compared from the oldest epoch it still holds,
    and a state table only at the epochs both hold (a checkpoint at an epoch the other side
    skipped is no difference until both are collected, at the end). A DAG not ``compared`` is
    checked against itself (:func:`delivered_as_drawn`)."""
    if not dag.compared:
        return delivered_as_drawn(cluster, dag, through)
    store = _direct(cluster)
    states = {e.state_uri for e in Ledger(store).entries(dag.reference) if e.state_uri}
    # The epoch after the soak's collection of the task writing each table: a table collected
    # whole, whose later epochs wrote no rows, holds none.
    collected = Collections(store).through(dag.dag_id)
    after_collected = {uri: collected.get(e.processor, 0) + 1 for e in Ledger(store).entries(dag.dag_id)
                       for uri in (e.state_uri, *(o.uri for o in e.outputs)) if uri}
    may_be_collected = collectable(store, dag.dag_id, through)
    found = []
    for uri in _durable_tables(store, dag):
        own = uri.replace(f"/{dag.reference}/", f"/{dag.dag_id}/")
        ours = _rows(store, own)
        got = [r for r in ours if r["epoch"] <= through]
        want = [r for r in _rows(store, uri) if r["epoch"] <= through]
        held = {r["epoch"] for r in got}
        # From the oldest epoch the soak's table holds at all: collected through ``through``, it
        # has nothing to compare yet.
        oldest = min((r["epoch"] for r in ours), default=after_collected.get(own, 1))
        keep = ((held & {r["epoch"] for r in want}) if uri in states
                else set(range(oldest, through + 1)) - may_be_collected.get(own, set()))
        got, want = [r for r in got if r["epoch"] in keep], [r for r in want if r["epoch"] in keep]
        if _canonical(got) != _canonical(want):
            found.append(f"{dag.dag_id} table {uri.split(f'/{dag.reference}/', 1)[1]}: {len(got)} rows against "
                         f"{len(want)}" + row_differences(got, want))
    if dag.name == "figure1":
        sink, theirs = ([r for r in QueryStatsStore(cluster.query_db, schema=d).rows() if r[0] <= through]
                        for d in (dag.dag_id, dag.reference))
        if sink != theirs:
            found.append(f"{dag.dag_id}'s SQL sink: {len(sink)} rows against {len(theirs)}")
    return found


def check(soak: Soak, reference: ReferenceBeside, progress: Progress = say) -> None:
    """Each DAG's durable tables (and figure1's SQL sink) against a failure-free run of the same
    epochs; its ledger whole, with no row doubled; no lease held; nothing in the store the ledger
    does not name. Both copies are collected first (``falkirk gc``), so that the soak's
    collections during the run leave no difference."""
    cluster, report = soak.cluster, soak.report
    store = _direct(cluster)
    behind = {d: n for d, n in report.epochs.items() if n > reference.done[d]}
    if behind:
        progress("the failure-free run of the last epochs: "
                 + ", ".join(f"{d} {reference.done[d] + 1}-{n}" for d, n in behind.items()))
    reference.through(report.epochs)
    for driven in soak.dags:
        dag, epochs = driven.dag, report.epochs[driven.dag_id]
        for dag_id in (dag.dag_id, dag.reference) if dag.compared else (dag.dag_id,):  # the copy is never broken
            env = soak.cli_env if dag_id == dag.dag_id else {k: v for k, v in soak.cli_env.items() if k != BROKEN_ENV}
            done = subprocess.run([*soak.falkirk, "gc", "--dag", dag_id], env=env, capture_output=True, text=True,
                                  timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"falkirk gc --dag {dag_id} exited {done.returncode}: {done.stderr.strip()[-1500:]}")
        name = dag.dag_id
        rows = Ledger(store).entries(name)
        keys = [(r.task_id, r.epoch, r.map_index) for r in rows]
        doubled = sorted({k for k in keys if keys.count(k) > 1})
        missing = sorted({(t, e) for t in dag.tasks for e in range(1, epochs + 1)} - {(t, e) for t, e, _ in keys})
        report.checks.append((f"{name}: no ledger row doubled", not doubled, f"{len(rows)} rows; doubled {doubled[:5]}"))
        report.checks.append((f"{name}: no epoch missing", not missing, f"missing {missing[:5]}"))
        lease = open_lease(RecoveryLog(store).events(name), name)
        report.checks.append((f"{name}: no lease held", lease is None, f"{lease}"))
        strays = stray_tables(cluster, name)
        channels = [t for t in strays if any(t.endswith(f"/{name}/{c}") for c in dag.channels)]
        strays = [t for t in strays if t not in channels]
        report.checks.append((f"{name}: nothing in the store outside what the ledger names", not strays,
                              f"not named by any ledger row: {strays[:5]}"))
        if dag.channels:
            full = {}  # where rows are left (the worker's disk too: placement decides it) and of which epochs
            for t in channels:
                epochs_left = [r["epoch"] for r in _rows(store, t)]
                if epochs_left:
                    where, table = t.split(f"/{name}/", 1)
                    full[f"{table} on {where.rsplit('/', 1)[-1]}"] = \
                        f"{len(epochs_left)} rows of epochs {sorted(set(epochs_left))}"
            report.checks.append((f"{name}: its channels carry nothing once every epoch is delivered",
                                  not full, f"rows left: {full}"))
        if not dag.compared:
            found = delivered_as_drawn(cluster, dag, epochs)
            report.checks.append((f"{name}: the sink holds what the producer logged, each row once", not found,
                                  "; ".join(found)[:2000]))
        for uri in _durable_tables(store, dag) if dag.compared else ():
            want = [r for r in _rows(store, uri) if r["epoch"] <= epochs]
            got = [r for r in _rows(store, uri.replace(f"/{dag.reference}/", f"/{name}/")) if r["epoch"] <= epochs]
            table = uri.split(f"/{dag.reference}/", 1)[1]
            report.checks.append((f"{name}: table {table}", _canonical(got) == _canonical(want),
                                  f"{len(got)} rows against {len(want)}" + row_differences(got, want)))
        if dag.name == "figure1":
            ours, theirs = (QueryStatsStore(cluster.query_db, schema=d) for d in (name, dag.reference))
            report.checks.append((f"{name}: the SQL sink equals the failure-free run's", ours.rows() == theirs.rows(),
                                  f"{len(ours.rows())} rows"))
            report.checks.append((f"{name}: nothing delivered twice to the SQL sink", ours.duplicates() == [], ""))
    report.discrepancies += [f"{name}: {detail}" for name, ok, detail in report.checks if not ok]


def delivered_as_drawn(cluster: Cluster, dag: SoakDag, through: int) -> list[str]:
    """What differs, in epochs 1..``through`` of ``falkirk_sampled`` (whose producer draws other
    rows on every run), between its sink and what its producer logged: the SQL table and the
    Delta table each hold every epoch's rows exactly once, the rows of ``draw``'s logged output
    (while the log still holds the epoch: ``falkirk gc`` collects it once ``deliver`` passed
    it), and each of ``deliver``'s durable state checkpoints counts and sums the rows delivered
    up to its epoch."""
    from falkirk.spark_jobs.sampled.targets import SampleTable

    store = _direct(cluster)

    def by_epoch(rows: list[tuple]) -> dict[int, list[tuple]]:
        out: dict[int, list[tuple]] = {}
        for row in sorted(rows):
            if row[0] <= through:
                out.setdefault(row[0], []).append(row)
        return out

    def table(task: str, name: str) -> list[dict]:
        uri = store.table_uri(Tier.DURABLE, dag.dag_id, task, name)
        return _rows(store, uri) if open_table(uri, store.options_for(uri)) is not None else []

    sql = by_epoch(SampleTable(cluster.query_db, dag.dag_id).rows())
    delta = by_epoch([(r["epoch"], r["key"], r["value"], r["chunk"]) for r in table("deliver", "delivered")])
    logged = by_epoch([(r["epoch"], r["key"], r["value"], r["chunk"]) for r in table("draw", "output")])
    found = []
    for epoch in range(1, through + 1):
        if not sql.get(epoch):
            found.append(f"{dag.dag_id} epoch {epoch}: nothing in the SQL table")
        if delta.get(epoch) != sql.get(epoch):
            found.append(f"{dag.dag_id} epoch {epoch}: the Delta table has {len(delta.get(epoch, []))} rows, the SQL "
                         f"table {len(sql.get(epoch, []))}" + row_differences(
                             [dict(zip(("epoch", "key", "value", "chunk"), r)) for r in delta.get(epoch, [])],
                             [dict(zip(("epoch", "key", "value", "chunk"), r)) for r in sql.get(epoch, [])]))
        if epoch in logged and logged[epoch] != sql.get(epoch):
            found.append(f"{dag.dag_id} epoch {epoch}: draw logged {len(logged[epoch])} rows, the SQL table holds "
                         f"{len(sql.get(epoch, []))}" + row_differences(
                             [dict(zip(("epoch", "key", "value", "chunk"), r)) for r in sql.get(epoch, [])],
                             [dict(zip(("epoch", "key", "value", "chunk"), r)) for r in logged[epoch]]))
    for state in table("deliver", "state"):
        if state["epoch"] > through:
            continue
        upto = [r for e, rows in sql.items() if e <= state["epoch"] for r in rows]
        want = (len(upto), sum(r[2] for r in upto))
        if (state["rows"], state["total"]) != want:
            found.append(f"{dag.dag_id}: deliver's state at epoch {state['epoch']} counts (rows, total) "
                         f"{(state['rows'], state['total'])}, the SQL table {want}")
    return found


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
    ledger row names (rolled-back rows included: their tables are the collector's to empty; a
    Delta table a task delivered to, as an external output, counts as named) and
    no row of the step log (a task's checkpoints inside an epoch: one table per step, emptied of
    each epoch once its ledger row commits, kept for the next epoch's)."""
    store = cluster.store
    named = {uri.removeprefix(EXTERNAL_SCHEME) for e in Ledger(store).entries(dag_id, include_invalidated=True)
             for uri in (e.state_uri, *(o.uri for o in e.outputs)) if uri}
    named |= {c.uri for c in StepLog(store).of_dag(dag_id)}
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
             servers: ClusterServers | None = None, progress: Progress = say,
             dags: list[SoakDag] | None = None) -> SoakReport:
    """The whole soak under ``root`` (emptied first); see the module docstring. ``dags``: the DAGs
    run side by side (default: every DAG of :data:`~devstack.soak.pipelines.SOAK_DAGS`).
    ``broken`` names recovery steps the shape gets wrong on purpose
    (:data:`falkirk.policies.faults.BROKEN`): a drill whose soak must end with discrepancies.
    ``servers``: started servers to share (the suite's), else the shape starts its own."""
    import shutil

    from devstack.soak.report import markdown, render

    dags = dags or list(SOAK_DAGS.values())
    root = root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    progress(f"soak: seed {schedule.seed}, {schedule.duration:.0f}s, {len(schedule.faults)} faults "
             f"({', '.join(f'{k} {n}' for k, n in schedule.counts().items())}); "
             f"DAGs {', '.join(d.dag_id for d in dags)}")
    env = {DAGS_ENV: ",".join(d.dag_id for d in dags),
           AUTO_RECOVER_ENV: ",".join(d.dag_id for d in dags if d.auto_recover), RECORDS_ENV: str(records), CRASH_ENV: f"@{root / 'crash_at'}",
           **{k: v for d in dags for k, v in d.env.items()},
           **({BROKEN_ENV: broken} if broken else {}),
           CLOCKS_ENV: str(root / "clocks"), "PYTHONPATH": str(CLOCK_DIR),  # a worker's clock can be shifted
           # a task instance on a killed worker is failed after 30 s, not Airflow's 5 minutes
           "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
           # and one a killed scheduler had queued is adopted by the next within a minute, not five
           "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30"}
    # (Airflow's task_queued_timeout stays 600 s: it is also the lifetime of the token a queued
    # task authenticates with, and a task waiting its turn on a busy worker must still start.)
    started = time.monotonic()
    with Cluster(root / "shape", dags_folder=SOAK_DAG_FOLDER, extra_env=env, spark_connect=True, s3_front=True,
                 servers=servers) as cluster:
        progress(f"the shape is up after {time.monotonic() - started:.0f}s: Airflow at {cluster.airflow.base_url}")
        soak = Soak(cluster, schedule, root, progress, broken, dags)
        reference = ReferenceBeside(reference_env(cluster, records), soak).start()
        soak.reference = reference
        watcher = Watcher(soak, root / "watch.log")
        try:
            report = soak.run()
        finally:
            watcher.stop()
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
    parser.add_argument("--records", type=int, default=2_000, help="figure1's events per epoch (default 2,000)")
    parser.add_argument("--dags", default=",".join(SOAK_DAGS),
                        help=f"the DAGs run side by side, figure1 first (default: {','.join(SOAK_DAGS)})")
    parser.add_argument("--broken", default="", metavar="STEP",
                        help=f"get a recovery step wrong on purpose, to see the soak fail: {', '.join(BROKEN)}")
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT / ".falkirk" / "soak",
                        help="where the shape keeps its databases, store, disks and logs (emptied first)")
    args = parser.parse_args(argv)
    try:
        mix = Mix.parse(args.mix)
        kinds_supported([k for k, w in mix.weights.items() if w > 0])
        faults.broken("", args.broken)  # refuses an unknown name
        dags = dags_named(args.dags)
        duration = parse_duration(args.duration)
    except ValueError as exc:
        parser.error(str(exc).replace(f"{BROKEN_ENV}:", "--broken:"))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    schedule = FaultSchedule.draw(seed, duration, mix, mean_gap=args.mean_gap)
    report = run_soak(args.root, schedule, records=args.records, broken=args.broken, dags=dags)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
