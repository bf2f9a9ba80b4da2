"""The recovery log: every plan, and who executed it when, beside the ledger.

``falkirk plan`` records each plan it computes (event ``planned``); an executor takes
the DAG's *lease* by appending ``started`` and gives it back with ``finished`` or
``failed``. The log is a Delta table (``_falkirk/recoveries``) and is append-only.

The lease is an optimistic lock: :meth:`RecoveryLog.begin` reads the log, checks that no
other recovery of the DAG is running, and appends ``started`` as the very next table
version, with no commit retry. Two executors that read the same version cannot both
commit the next one: the loser gets :class:`LeaseHeld`, and nothing else happens.

>>> import tempfile
>>> from policies.recovery import FailedTask, RecoveryPlan
>>> from policies.store import StoreConfig
>>> root = tempfile.mkdtemp()
>>> log = RecoveryLog(StoreConfig(root + "/store", root + "/scratch"))
>>> plan = RecoveryPlan("orders", (FailedTask("a", 2),), 2, 7, ())
>>> log.record(plan) == plan.plan_id
True
>>> log.plan(plan.plan_id) == plan
True
>>> lease = log.begin(plan, holder="alice")
>>> log.begin(plan, holder="bob")
Traceback (most recent call last):
...
policies.recovery_log.LeaseHeld: DAG 'orders' is being recovered by plan ... (alice, since ...); wait until it finishes, then plan again
>>> log.end(lease, "finished")
>>> log.begin(plan, holder="bob")
Traceback (most recent call last):
...
policies.recovery_log.AlreadyReplayed: plan ... was already executed (finished ...); nothing to do
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
from deltalake import CommitProperties, write_deltalake
from deltalake.exceptions import CommitFailedError

from policies.epoch_tables import open_table, scan
from policies.recovery import PlanError, RecoveryPlan
from policies.store import StoreConfig

SCHEMA = pa.schema(
    [
        pa.field("dag_id", pa.string(), nullable=False),
        pa.field("plan_id", pa.string(), nullable=False),
        # planned | started | finished | failed
        pa.field("event", pa.string(), nullable=False),
        pa.field("holder", pa.string(), nullable=False),
        # the plan's JSON for "planned"; a message otherwise
        pa.field("detail", pa.string(), nullable=False),
        pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
ENDED = ("finished", "failed")


class LeaseHeld(PlanError):
    """Another recovery of the same DAG is running (or started at the same moment)."""


class AlreadyReplayed(PlanError):
    """The plan was already executed to the end: executing it again does nothing."""


@dataclass(frozen=True)
class Lease:
    """The right to execute ``plan_id`` on ``dag_id``, held by ``holder`` since ``since``."""

    dag_id: str
    plan_id: str
    holder: str
    since: datetime


class RecoveryLog:
    """The ``_falkirk/recoveries`` table of a store."""

    def __init__(self, store: StoreConfig) -> None:
        self.store = store
        self.uri = store.control_uri("recoveries")

    def record(self, plan: RecoveryPlan) -> str:
        """Record a computed plan (once per plan id); returns its id for ``falkirk replay``."""
        if not any(r["plan_id"] == plan.plan_id and r["event"] == "planned" for r in self.events(plan.dag_id)):
            self._append(plan.dag_id, plan.plan_id, "planned", "falkirk plan",
                         json.dumps(plan.to_json(), sort_keys=True), table=open_table(self.uri, self._options),
                         retries=None)
        return plan.plan_id

    def plan(self, plan_id: str) -> RecoveryPlan:
        """The recorded plan ``plan_id``."""
        for r in self.events():
            if r["plan_id"] == plan_id and r["event"] == "planned":
                return RecoveryPlan.from_json(json.loads(r["detail"]))
        raise PlanError(f"plan_id {plan_id!r}: no such plan in {self.uri}; compute one with `falkirk plan`")

    def events(self, dag_id: str | None = None) -> list[dict]:
        """The log's rows, oldest first."""
        table = open_table(self.uri, self._options)
        if table is None:
            return []
        rows = scan(table, where={"dag_id": dag_id} if dag_id else None).to_pylist()
        return sorted(rows, key=lambda r: r["recorded_at"])

    def running(self, dag_id: str) -> Lease | None:
        """The recovery of ``dag_id`` that has started and not ended, if any."""
        return _running(self.events(dag_id), dag_id)

    def check_not_finished(self, plan: RecoveryPlan) -> None:
        """Raise :class:`AlreadyReplayed` if ``plan`` was executed to the end."""
        _check_not_finished(self.events(plan.dag_id), plan.plan_id)

    def begin(self, plan: RecoveryPlan, holder: str) -> Lease:
        """Take the DAG's lease for ``plan``; raises :class:`LeaseHeld` or :class:`AlreadyReplayed`."""
        table = open_table(self.uri, self._options)
        events = [] if table is None else sorted(
            scan(table, where={"dag_id": plan.dag_id}).to_pylist(), key=lambda r: r["recorded_at"])
        _check_not_finished(events, plan.plan_id)
        other = _running(events, plan.dag_id)
        if other is not None:
            raise LeaseHeld(f"DAG {plan.dag_id!r} is being recovered by plan {other.plan_id} ({other.holder}, "
                            f"since {other.since:%Y-%m-%d %H:%M:%S}Z); wait until it finishes, then plan again")
        now = datetime.now(timezone.utc)
        try:
            self._append(plan.dag_id, plan.plan_id, "started", holder, "", table=table, retries=0, at=now)
        except CommitFailedError:
            raise LeaseHeld(f"DAG {plan.dag_id!r}: another recovery took the lease at the same moment; "
                            f"wait until it finishes, then plan again") from None
        return Lease(plan.dag_id, plan.plan_id, holder, now)

    def end(self, lease: Lease, event: str, detail: str = "") -> None:
        """Give the lease back: ``finished`` (the plan is done) or ``failed``."""
        if event not in ENDED:
            raise ValueError(f"event={event!r}: use one of {ENDED}")
        self._append(lease.dag_id, lease.plan_id, event, lease.holder, detail,
                     table=open_table(self.uri, self._options), retries=None)

    @property
    def _options(self) -> dict[str, str] | None:
        return self.store.options_for(self.uri)

    def _append(self, dag_id: str, plan_id: str, event: str, holder: str, detail: str, *, table,
                retries: int | None, at: datetime | None = None) -> None:
        row = {"dag_id": dag_id, "plan_id": plan_id, "event": event, "holder": holder, "detail": detail,
               "recorded_at": at or datetime.now(timezone.utc)}
        write_deltalake(table if table is not None else self.uri, pa.Table.from_pylist([row], schema=SCHEMA),
                        mode="append", storage_options=self._options,
                        commit_properties=CommitProperties(max_commit_retries=retries))


def _running(events: list[dict], dag_id: str) -> Lease | None:
    state: dict[str, dict] = {}
    for r in events:
        if r["event"] == "started" or (r["event"] in ENDED and r["plan_id"] in state):
            state[r["plan_id"]] = r
    for plan_id, r in state.items():
        if r["event"] == "started":
            return Lease(dag_id, plan_id, r["holder"], r["recorded_at"])
    return None


def _check_not_finished(events: list[dict], plan_id: str) -> None:
    done = [r for r in events if r["plan_id"] == plan_id and r["event"] == "finished"]
    if done:
        raise AlreadyReplayed(f"plan {plan_id} was already executed (finished {_when(done[-1])}); nothing to do")


def _when(row: dict) -> str:
    return f"{row['recorded_at']:%Y-%m-%d %H:%M:%S}Z"
