"""When a recorded plan is still current, through the real scheduler (after the other drills).

A plan goes stale when its own DAG's ledger moves (a commit or a rollback of that DAG), never
because other DAGs commit into the same ledger table; and a replay that Airflow refuses leaves
nothing behind that would let a later replay skip that check."""

from __future__ import annotations

import pytest

from devstack.demo import run_id_of
from falkirk.plugins.airflow_rest import AirflowError
from falkirk.plugins.recovery import plan, replay
from falkirk.policies.planning.recovery import PlanError
from falkirk.policies.store.ledger import Ledger
from falkirk.policies.planning.recovery_log import RecoveryLog
from falkirk.spark_jobs.clicks.feed import clicks_for_epoch, deliver
from tests.integration.recovery.drill import A, B, REF, Drill, clock, rows, tries
from falkirk.policies.regimes import Tier

pytestmark = pytest.mark.integration


def _run_epoch(drill: Drill, dag: str, epoch: int) -> None:
    deliver(drill.inbox, dag, epoch, clicks_for_epoch(epoch))
    drill.client.trigger(dag, run_id_of(epoch), clock().logical_date(epoch))


def test_a_plan_stays_current_while_two_other_dags_commit(drill: Drill) -> None:
    ledger = Ledger(drill.store)
    p = plan(REF, drill.store, drill.client, bad_epochs=[("sink", 6)])
    before = ledger.version()
    sink = rows(drill.store, REF, "sink", "output", Tier.DURABLE)
    for dag in (A, B):  # two other DAGs commit their epoch 7 into the same ledger table
        _run_epoch(drill, dag, 7)
    for dag in (A, B):
        assert drill.client.wait_for_run(dag, run_id_of(7), timeout=900) == "success"
    assert ledger.version() > before and ledger.dag_version(REF) == p.ledger_version
    report = replay(p.plan_id, drill.store, drill.client, progress=print)  # accepted at once
    assert not report.already_done
    assert tries(drill.client, REF, [6])[6, "sink"] == ("success", 2)  # the plan's one re-run ran
    assert rows(drill.store, REF, "sink", "output", Tier.DURABLE) == sink  # and changed nothing else


def test_a_replay_airflow_refused_leaves_nothing_to_resume_and_the_next_checks_staleness(drill: Drill) -> None:
    p = plan(A, drill.store, drill.client, bad_epochs=[("sink", 7)])
    with pytest.raises(AirflowError, match="403"):  # a viewer may not clear task instances
        replay(p.plan_id, drill.store, drill.stack.client("viewer"), progress=print)
    assert [r["event"] for r in RecoveryLog(drill.store).events(A) if r["plan_id"] == p.plan_id] == ["planned"]
    _run_epoch(drill, A, 8)  # the DAG commits meanwhile: the plan is stale
    assert drill.client.wait_for_run(A, run_id_of(8), timeout=900) == "success"
    with pytest.raises(PlanError, match=f"plan {p.plan_id}: the ledger changed since the plan was computed"):
        replay(p.plan_id, drill.store, drill.client, progress=print)
    assert [r["event"] for r in RecoveryLog(drill.store).events(A) if r["plan_id"] == p.plan_id] == ["planned"]
