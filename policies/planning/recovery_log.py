"""The recovery log: every plan, and who executed it when, beside the ledger.

``falkirk plan`` records each plan it computes (event ``planned``); an executor takes
the DAG's *lease* by appending ``started`` (``resumed`` when it continues a plan that an
earlier executor left half-done) and gives it back with ``finished`` or ``failed``. The
log is a Delta table (``_falkirk/recoveries``) and is append-only. Garbage collection
takes the same lease (plan ids ``gc-…``), so a collection and a recovery of one DAG never
run at the same time.

The lease is an optimistic lock: :meth:`RecoveryLog.begin` reads the log, checks that no
other holder's lease is live, and appends its row as the very next table version, with
no commit retry. Two executors that read the same version cannot both commit the next
one: the loser gets :class:`LeaseHeld`, and nothing else happens.

A lease cannot outlive its holder. The holder renews it (``heartbeat``) while it works;
a lease not renewed for :func:`lease_seconds` (``FALKIRK_LEASE_SECONDS``, default 120)
has expired, and the next :meth:`~RecoveryLog.begin` takes it over, recording ``expired``
for the old holder in the same commit. ``falkirk release --dag D`` ends a lease by hand
(``released``, with who and why).

>>> import tempfile
>>> from falkirk.policies.planning.recovery import FailedTask, RecoveryPlan
>>> from falkirk.policies.store import StoreConfig
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
falkirk.policies.planning.recovery_log.LeaseHeld: DAG 'orders' is being recovered by plan ... (alice, since ...); wait until it finishes, ...
>>> log.end(lease, "finished")
True
>>> log.begin(plan, holder="bob")
Traceback (most recent call last):
...
falkirk.policies.planning.recovery_log.AlreadyReplayed: plan ... was already executed (finished ...); nothing to do
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import CommitProperties, write_deltalake
from deltalake.exceptions import CommitFailedError

from falkirk.policies.planning.recovery import PlanError, RecoveryPlan
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import (
    TABLE_PROPERTIES,
    StoreUnreachable,
    open_table,
    retry_lost_races,
    scan,
    unanswered,
)

SCHEMA = pa.schema(
    [
        pa.field("dag_id", pa.string(), nullable=False),
        pa.field("plan_id", pa.string(), nullable=False),
        # planned | started | resumed | heartbeat | finished | failed | released | expired
        pa.field("event", pa.string(), nullable=False),
        pa.field("holder", pa.string(), nullable=False),
        # the plan's JSON for "planned"; for the lease's own rows JSON {"token", "note"}; a message otherwise
        pa.field("detail", pa.string(), nullable=False),
        pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
ENDED = ("finished", "failed", "released", "expired")
TAKEN = ("started", "resumed")
LEASE_ENV = "FALKIRK_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 120
GC_PREFIX = "gc-"


def lease_seconds() -> int:
    """How long a lease lasts without renewal: ``FALKIRK_LEASE_SECONDS`` (default 120, 5 to 86400)."""
    raw = os.environ.get(LEASE_ENV, "")
    try:
        value = int(raw) if raw else DEFAULT_LEASE_SECONDS
    except ValueError:
        value = -1
    if not 5 <= value <= 86400:
        raise ValueError(f"{LEASE_ENV}={raw!r}: give a whole number of seconds from 5 to 86400 "
                         f"(default {DEFAULT_LEASE_SECONDS})")
    return value


class LeaseHeld(PlanError):
    """Another recovery of the same DAG is running (or started at the same moment)."""


class LeaseLost(PlanError):
    """This holder's lease expired and was taken over, or was released by hand: stop working."""


class NoLease(PlanError):
    """There is no lease to release."""


class AlreadyReplayed(PlanError):
    """The plan was already executed to the end: executing it again does nothing."""


@dataclass(frozen=True)
class Lease:
    """The right to execute ``plan_id`` on ``dag_id``, held by ``holder`` since ``since``.

    ``token`` tells this holder's rows from another's; ``resumed`` is set when the plan was
    started before by a holder that did not finish it; ``last_seen`` is the holder's latest
    row (taken or renewed); ``log_rows``: how many rows of the DAG the log held when the lease
    was taken, its own not counted (what a holder compares with an earlier read of the log: no
    other recovery, collection or plan of the DAG was recorded in between if they are equal).
    """

    dag_id: str
    plan_id: str
    holder: str
    since: datetime
    token: str = ""
    resumed: bool = False
    last_seen: datetime | None = None
    log_rows: int = 0

    def expires_at(self, seconds: int | None = None) -> datetime:
        return (self.last_seen or self.since) + timedelta(seconds=seconds or lease_seconds())

    def expired(self, now: datetime | None = None, seconds: int | None = None) -> bool:
        return (now or datetime.now(UTC)) > self.expires_at(seconds)


class RecoveryLog:
    """The ``_falkirk/recoveries`` table of a store."""

    def __init__(self, store: StoreConfig) -> None:
        self.store = store
        self.uri = store.control_uri("recoveries")

    def record(self, plan: RecoveryPlan) -> str:
        """Record a computed plan (once per plan id); returns its id for ``falkirk replay``."""
        if not any(r["plan_id"] == plan.plan_id and r["event"] == "planned" for r in self.events(plan.dag_id)):
            self._append([_row(plan.dag_id, plan.plan_id, "planned", "falkirk plan",
                               json.dumps(plan.to_json(), sort_keys=True))],
                         table=open_table(self.uri, self._options), retries=None)
        return plan.plan_id

    def link(self, plans: Sequence[RecoveryPlan]) -> None:
        """Record that ``plans`` (of different DAGs) are one recovery across DAGs, in replay
        order: one ``across`` row per plan, in its DAG's log, naming them all (once per plan)."""
        body = json.dumps({"plans": [[p.dag_id, p.plan_id] for p in plans]})
        done = {(r["plan_id"], r["detail"]) for p in plans for r in self.events(p.dag_id) if r["event"] == "across"}
        rows = [_row(p.dag_id, p.plan_id, "across", "falkirk plan", body) for p in plans
                if (p.plan_id, body) not in done]
        if rows:
            self._append(rows, table=open_table(self.uri, self._options), retries=None)

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

    def check_free(self, dag_id: str) -> None:
        """Raise :class:`LeaseHeld` if a live lease of ``dag_id`` is held (reads only)."""
        held = live_lease(self.events(dag_id), dag_id)
        if held is not None:
            raise _held(held)

    def check_not_finished(self, plan: RecoveryPlan) -> None:
        """Raise :class:`AlreadyReplayed` if ``plan`` was executed to the end."""
        check_not_finished(self.events(plan.dag_id), plan.plan_id)

    def begin(self, plan: RecoveryPlan, holder: str) -> Lease:
        """Take the DAG's lease for ``plan``; raises :class:`LeaseHeld` or :class:`AlreadyReplayed`.

        The lease is ``resumed`` when the plan was started before and never finished (its
        executor failed, was killed, or its lease was released or expired).
        """
        return self._take(plan.dag_id, plan.plan_id, holder, check_finished=True)

    def begin_collection(self, dag_id: str, holder: str) -> Lease:
        """Take the DAG's lease for a garbage collection; raises :class:`LeaseHeld` while a
        recovery (or another collection) of the DAG holds it."""
        return self._take(dag_id, f"{GC_PREFIX}{uuid.uuid4().hex[:12]}", holder, check_finished=False)

    def renew(self, lease: Lease) -> Lease:
        """Renew ``lease`` (a ``heartbeat`` row); raises :class:`LeaseLost` if it is no longer held."""
        self._check_held(lease)
        now = datetime.now(UTC)
        self._append([_row(lease.dag_id, lease.plan_id, "heartbeat", lease.holder, _lease_detail(lease.token), now)],
                     table=open_table(self.uri, self._options), retries=None)
        self._check_held(lease)
        return replace(lease, last_seen=now)

    def rolled_back(self, lease: Lease, rows: int) -> Lease:
        """Record that ``lease``'s plan has made its invalidations (``rows`` of them, perhaps none):
        a heartbeat saying so, which a resumed replay of the plan reads (:func:`invalidations_made`)
        so as never to roll back what the plan's own re-runs committed since."""
        self._check_held(lease)
        now = datetime.now(UTC)
        detail = json.dumps({"token": lease.token, "invalidated": rows})
        self._append([_row(lease.dag_id, lease.plan_id, "heartbeat", lease.holder, detail, now)],
                     table=open_table(self.uri, self._options), retries=None)
        return replace(lease, last_seen=now)

    def end(self, lease: Lease, event: str, detail: str = "") -> bool:
        """Give the lease back: ``finished`` (the plan is done) or ``failed``. Returns ``False``
        (and records nothing) when the lease was taken over or released meanwhile."""
        if event not in ("finished", "failed"):
            raise ValueError(f"event={event!r}: use finished or failed")
        try:
            self._check_held(lease)
        except LeaseLost:
            return False
        self._append([_row(lease.dag_id, lease.plan_id, event, lease.holder, detail)],
                     table=open_table(self.uri, self._options), retries=None)
        return True

    def release(self, dag_id: str, by: str, reason: str) -> Lease:
        """End the DAG's lease by hand, whoever holds it (``released``, recorded with ``by`` and
        ``reason``); returns the lease that was released. For a holder known to be dead: a
        live one notices at its next renewal and stops."""
        if not reason or not reason.strip():
            raise PlanError("--reason: say why the lease is released (it is recorded in the recovery log)")
        if len(reason) > 2000:
            raise PlanError(f"--reason: {len(reason)} characters; keep it under 2000")
        held = open_lease(self.events(dag_id), dag_id)
        if held is None:
            raise NoLease(f"--dag: no recovery or collection of DAG {dag_id!r} holds a lease; nothing to release")
        detail = json.dumps({"token": held.token, "note": f"released by {by}: {reason.strip()} "
                                                           f"(held by {held.holder} since {_at(held.since)})"})
        self._append([_row(dag_id, held.plan_id, "released", by, detail)],
                     table=open_table(self.uri, self._options), retries=None)
        return held

    def _take(self, dag_id: str, plan_id: str, holder: str, check_finished: bool) -> Lease:
        # The log is one table for every DAG: a row another DAG appended between this read and
        # this append also fails the append. Read again and retry: a lease on this DAG taken
        # meanwhile is then found, and refused by name.
        for _ in range(LEASE_RACES):
            lease = self._try_take(dag_id, plan_id, holder, check_finished)
            if lease is not None:
                return lease
        raise LeaseHeld(f"DAG {dag_id!r}: the recovery log at {self.uri} changed under each of {LEASE_RACES} "
                        f"attempts to take the lease (many recoveries or collections at once); try again")

    def _try_take(self, dag_id: str, plan_id: str, holder: str, check_finished: bool) -> Lease | None:
        """The lease, or ``None`` when another row landed in the log between the read and the append."""
        table = open_table(self.uri, self._options)
        events = [] if table is None else sorted(
            scan(table, where={"dag_id": dag_id}).to_pylist(), key=lambda r: r["recorded_at"])
        if check_finished:
            check_not_finished(events, plan_id)
        now = datetime.now(UTC)
        rows = []
        other = open_lease(events, dag_id)
        if other is not None:
            if not other.expired(now):
                raise _held(other)
            rows.append(_row(dag_id, other.plan_id, "expired", holder, json.dumps({
                "token": other.token, "note": f"lease of {other.holder} not renewed since "
                                              f"{_at(other.last_seen or other.since)}; taken over by {holder}"}),
                             now))
            now += timedelta(microseconds=1)  # the takeover orders after the expiry
        token = uuid.uuid4().hex
        resumed = any(r["plan_id"] == plan_id and r["event"] in TAKEN for r in events)
        note = ""
        if resumed:
            note = "resumes the plan where its last executor stopped"
        rows.append(_row(dag_id, plan_id, "resumed" if resumed else "started", holder,
                         _lease_detail(token, note), now))
        lease = Lease(dag_id, plan_id, holder, now, token, resumed, now, log_rows=len(events))
        try:
            self._append(rows, table=table, retries=0)
        except CommitFailedError:
            return None
        except Exception as exc:
            if not unanswered(exc):
                raise
            # The store did not answer: the row may have landed. Ask, while it stays silent.
            held = retry_lost_races(lambda: open_lease(self.events(dag_id), dag_id), attempts=1, uri=self.uri)
            if held is not None and held.token != token and not held.expired():
                raise _held(held) from None
            if held is None or held.token != token:
                raise StoreUnreachable(self.uri, None, exc) from exc
        return lease

    def _check_held(self, lease: Lease) -> None:
        held = open_lease(self.events(lease.dag_id), lease.dag_id)
        if held is None or held.token != lease.token:
            raise LeaseLost(f"plan {lease.plan_id}: the lease of {lease.holder} on DAG {lease.dag_id!r} was "
                            f"released or taken over; stopping. Resume with: falkirk replay {lease.plan_id}")

    @property
    def _options(self) -> dict[str, str] | None:
        return self.store.options_for(self.uri)

    def _append(self, rows: list[dict], *, table, retries: int | None) -> None:
        """Append ``rows``; with ``retries=None`` (a row that may land twice without harm: a
        heartbeat, an end, a release) also while the store does not answer."""
        if retries is None:
            retry_lost_races(lambda: self._write(rows, table=table, retries=None), attempts=1, uri=self.uri)
        else:
            self._write(rows, table=table, retries=retries)

    def _write(self, rows: list[dict], *, table, retries: int | None) -> None:
        write_deltalake(table if table is not None else self.uri, pa.Table.from_pylist(rows, schema=SCHEMA),
                        mode="append", storage_options=self._options,
                        configuration=TABLE_PROPERTIES if table is None else None,
                        commit_properties=CommitProperties(max_commit_retries=retries))


LEASE_RACES = 20  # appends lost to other rows in a row before taking a lease gives up


def _held(other: Lease) -> LeaseHeld:
    what = "collected (garbage collection)" if other.plan_id.startswith(GC_PREFIX) else \
        f"recovered by plan {other.plan_id}"
    return LeaseHeld(
        f"DAG {other.dag_id!r} is being {what} ({other.holder}, since {_at(other.since)}); wait until it "
        f"finishes, then plan again. Its lease expires at {_at(other.expires_at())} unless renewed; "
        f"if its holder is dead, release it: falkirk release --dag {other.dag_id} --reason '...'")


def _row(dag_id: str, plan_id: str, event: str, holder: str, detail: str, at: datetime | None = None) -> dict:
    return {"dag_id": dag_id, "plan_id": plan_id, "event": event, "holder": holder, "detail": detail,
            "recorded_at": at or datetime.now(UTC)}


def _lease_detail(token: str, note: str = "") -> str:
    return json.dumps({"token": token, **({"note": note} if note else {})})


def _token(row: dict) -> str:
    try:
        return str(json.loads(row["detail"]).get("token", ""))
    except (ValueError, AttributeError):
        return ""


def open_lease(events: list[dict], dag_id: str) -> Lease | None:
    """The lease taken last and not ended (``events`` oldest first), with its latest renewal; it
    may have expired (:func:`live_lease` leaves an expired one out)."""
    held: Lease | None = None
    for r in events:
        if r["event"] in TAKEN:
            held = Lease(dag_id, r["plan_id"], r["holder"], r["recorded_at"], _token(r), r["event"] == "resumed",
                         r["recorded_at"])
        elif held is not None and r["plan_id"] == held.plan_id:
            if r["event"] == "heartbeat" and _token(r) == held.token:
                held = Lease(held.dag_id, held.plan_id, held.holder, held.since, held.token, held.resumed,
                             r["recorded_at"])
            elif r["event"] in ENDED and (r["event"] in ("finished", "failed") or _token(r) in ("", held.token)):
                held = None
    return held


def live_lease(events: list[dict], dag_id: str) -> Lease | None:
    """The lease in ``events`` (the DAG's log, oldest first) that is held and not expired, if any."""
    held = open_lease(events, dag_id)
    return held if held is not None and not held.expired() else None


def invalidations_made(events: list[dict], plan_id: str) -> bool:
    """Whether ``events`` (the DAG's log) show that a replay of ``plan_id`` made its invalidations
    (:meth:`RecoveryLog.rolled_back`).

    >>> invalidations_made([{"plan_id": "p", "event": "heartbeat", "detail": '{"token": "t", "invalidated": 0}'}], "p")
    True
    >>> invalidations_made([{"plan_id": "p", "event": "heartbeat", "detail": '{"token": "t"}'}], "p")
    False
    """
    for r in events:
        if r["plan_id"] == plan_id and r["event"] == "heartbeat":
            try:
                if "invalidated" in json.loads(r["detail"] or "{}"):
                    return True
            except ValueError:
                continue
    return False


def check_lease_free(events: list[dict], dag_id: str) -> None:
    """Raise :class:`LeaseHeld` if ``events`` (the DAG's log) show a live lease on ``dag_id``."""
    held = live_lease(events, dag_id)
    if held is not None:
        raise _held(held)


def check_not_finished(events: list[dict], plan_id: str) -> None:
    """Raise :class:`AlreadyReplayed` if ``events`` (the DAG's log) show ``plan_id`` finished."""
    done = [r for r in events if r["plan_id"] == plan_id and r["event"] == "finished"]
    if done:
        raise AlreadyReplayed(f"plan {plan_id} was already executed (finished {_when(done[-1])}); nothing to do")


def _when(row: dict) -> str:
    return _at(row["recorded_at"])


def _at(when: datetime) -> str:
    return f"{when:%Y-%m-%d %H:%M:%S}Z"
