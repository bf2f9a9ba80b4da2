"""The replay's observer: one pass's views, read from Airflow first and the store after.

Airflow's REST API gives each watched epoch's DAG run and task instances (all of them in two
requests), the DAG's active runs, ``max_active_runs`` and whether it is paused; the store gives
the ledger's current rows from one :class:`~falkirk.policies.store.ledger.LedgerSnapshot`
brought forward each pass (only the commits made since the last pass are read), the completions
of the rows the pass may act on, and the process-pair layout. Reads only: every write is the
applier's (:mod:`falkirk.plugins.replay.apply`).
"""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc

from falkirk.plugins.airflow_rest import AirflowClient
from falkirk.policies.ids import ProcessorId
from falkirk.policies.planning.chains import TaskGraph
from falkirk.policies.planning.recovery import RecoveryPlan
from falkirk.policies.planning.replay_decisions import FAILED, AirflowRun, RolledBack
from falkirk.policies.replay.views import AirflowView, Memory, StoreView
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.control import Completions, PairLayouts
from falkirk.policies.store.ledger import LedgerSnapshot, entries_of

# Stages whose rules read the sweep's inputs, the ledger's graph and every row's completion.
_LOOKING = frozenset({"start", "later"})


class Observer:
    """Reads the views of one pass of ``plan``'s replay (see the module docstring)."""

    def __init__(self, plan: RecoveryPlan, store: StoreConfig, client: AirflowClient, snapshot: LedgerSnapshot):
        self.plan, self.store, self.client, self.snapshot = plan, store, client, snapshot
        self.paired = any(ProcessorId.parse(t).partitioned for t, _ in plan.rerun_set())
        self._downstream: dict[ProcessorId, frozenset[ProcessorId]] | None = None

    def observe(self, memory: Memory) -> tuple[StoreView, AirflowView]:
        """The store and Airflow as they are now, Airflow read first."""
        self.client.on_poll()
        airflow = self.airflow(memory)
        return self.stored(memory, airflow), airflow

    def airflow(self, memory: Memory) -> AirflowView:
        dag_id = self.plan.dag_id
        watched = {e: memory.run_ids[e] for e in sorted(memory.watch) if e in memory.run_ids}
        held = self.client.runs_with_instances(dag_id, watched.values())
        runs, missing = {}, set()
        for epoch, run_id in watched.items():
            if run_id not in held:
                missing.add(epoch)
                continue
            run, tis = held[run_id]
            runs[epoch] = AirflowRun({t: ti.get("state") for t, ti in tis.items()},
                                     {t: ti.get("queue") for t, ti in tis.items()}, run.get("state"))
        dag = self.client.dag(dag_id)
        return AirflowView(runs=runs, missing=frozenset(missing), active=tuple(self.client.active_runs(dag_id)),
                           max_active_runs=dag.get("max_active_runs"), paused=bool(dag.get("is_paused")))

    def stored(self, memory: Memory, airflow: AirflowView) -> StoreView:
        snap = self.snapshot
        snap.refresh()
        looking = memory.stage in _LOOKING
        first = min([*memory.watch, self.plan.last_epoch + 1])
        rows = snap.rows.filter(pc.greater_equal(snap.rows.column("epoch"), first)) if snap.rows.num_rows else snap.rows
        current, rolled = entries_of(rows, snap.gone)
        by_instance = {(e.processor, e.epoch): e for e in current}
        acting = by_instance if looking else {k: e for k, e in by_instance.items() if airflow.state(k) in FAILED}
        completed = Completions(self.store).completed_among(acting.values()) if acting else []
        view: dict[str, Any] = {}
        if looking:
            gone, at = snap.rolled_back_by(self.plan.plan_id)
            view.update(rolled_back=tuple(RolledBack(p, e, v) for p, e, v in gone), rolled_back_at=at,
                        downstream=self.downstream(refresh=memory.stage == "later"))
        layout = PairLayouts(self.store).load(self.plan.dag_id) if self.paired else None
        if layout is not None:
            view.update(taken_over=frozenset(ProcessorId.parse(p) for p in layout.taken_over()),
                        lost_partitions=frozenset(layout.lost_partitions()))
        return StoreView(rows=by_instance, run_ids={e.epoch: e.run_id for e in [*current, *rolled]},
                         completed=frozenset((e.processor, e.epoch) for e in completed), **view)

    def downstream(self, refresh: bool = False) -> dict[ProcessorId, frozenset[ProcessorId]]:
        """Each task's downstream tasks in the ledger's graph (itself excluded), from every row."""
        if self._downstream is None or refresh:
            current, rolled = entries_of(self.snapshot.rows, self.snapshot.gone)
            graph = TaskGraph.from_ledger([*current, *rolled])
            self._downstream = {t: frozenset(graph.downstream(t)[1:]) for t in graph.tasks}
        return self._downstream
