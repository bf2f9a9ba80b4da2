"""The replay's applier: the one place a replay writes, to Airflow (REST) and to the store.

It carries out a pass's actions in their order, prints each one's progress line once it is done,
renews the lease, and holds the crash points the fault tests stop a replay at. It decides nothing:
each action names everything its execution needs.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from falkirk.plugins.airflow_rest import AirflowClient
from falkirk.plugins.outlet_events import emit_missing_events
from falkirk.policies.faults import crash_point
from falkirk.policies.ids import ReplicaId
from falkirk.policies.planning.recovery import RecoveryPlan
from falkirk.policies.planning.recovery_log import Lease, RecoveryLog, lease_seconds
from falkirk.policies.replay.actions import (
    Action,
    Clear,
    Invalidate,
    MarkSuccess,
    QueueRun,
    RestorePairs,
    Say,
    SetRunState,
    SettleSecondRuns,
)
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.control import Invalidations
from falkirk.policies.store.ledger import Ledger

Progress = Callable[[str], None]


class Applier:
    """Carries out the actions of ``plan``'s replay under ``lease`` (see the module docstring)."""

    def __init__(self, plan: RecoveryPlan, store: StoreConfig, client: AirflowClient, log: RecoveryLog,
                 lease: Lease, progress: Progress, reads_from: int | None = None):
        self.plan, self.store, self.client, self.log, self.lease = plan, store, client, log, lease
        self.progress = progress
        # Whole reads of the ledger table (in this process) from ``reads_from`` to the first clear.
        self.reads_from = Ledger.reads if reads_from is None else reads_from
        self.reads_before_clear: int | None = None

    def apply(self, action: Action) -> None:
        """Carry out one action."""
        dag_id, name = self.plan.dag_id, f"plan {self.plan.plan_id}"
        if isinstance(action, Clear):
            if self.reads_before_clear is None:
                self.reads_before_clear = Ledger.reads - self.reads_from
            self.client.clear(dag_id, action.run_id, list(action.tasks))
            self.progress(action.line)
            self.renew()
            crash_point("replay", action.epoch, "after-clear", dag_id=dag_id)
        elif isinstance(action, MarkSuccess):
            row = action.row
            emitted = emit_missing_events(self.client, row)
            if emitted:
                self.progress(f"{name}: emitted the asset events of {row.processor} epoch {row.epoch} (incarnation "
                              f"{row.incarnation}) that its failed attempt did not: {', '.join(emitted)}")
            self.client.set_state(dag_id, action.run_id, row.processor, "success", note=action.note)
        elif isinstance(action, Invalidate):
            if Invalidations(self.store).record(action.rows, action.name):
                self.progress(action.line)
        elif isinstance(action, QueueRun):
            self.client.queue_run(dag_id, action.run_id, note=action.note)
        elif isinstance(action, SetRunState):
            self.client.set_run_state(dag_id, action.run_id, action.state, note=action.note)
        elif isinstance(action, Say):
            self.progress(action.line)
        elif isinstance(action, RestorePairs):
            self._restore(action)
        elif isinstance(action, SettleSecondRuns):
            from falkirk.plugins.asset_recovery import settle_second_runs

            settle_second_runs(self.plan, self.store, self.client, self.progress)
        else:  # pragma: no cover (every action of falkirk.policies.replay.actions is handled above)
            raise TypeError(f"no applier for {action!r}")

    def renew(self) -> None:
        """Renew the lease once a third of it has passed (raises ``LeaseLost`` if it was taken)."""
        now = datetime.now(UTC)
        if (now - (self.lease.last_seen or self.lease.since)).total_seconds() >= lease_seconds() / 3:
            self.lease = self.log.renew(self.lease)

    def _restore(self, action: RestorePairs) -> None:
        from falkirk.policies.pairs import restore_workers
        from falkirk.policies.store.control import PairLayouts
        from falkirk.policies.workers import pair_workers

        layouts = PairLayouts(self.store)
        before = layouts.load(self.plan.dag_id)
        if before is None:
            return
        live = restore_workers(before, pair_workers())
        after = before
        for task, partition in action.partitions:
            after = after.restore(task, partition, live)
        layouts.save(self.plan.dag_id, after, before=before)
        self.progress(f"plan {self.plan.plan_id}: restored "
                      f"{', '.join(ReplicaId.partition_name(t, p) for t, p in action.partitions)} on the durable "
                      f"path: both replicas re-run from their durable state on {', '.join(live)}")
