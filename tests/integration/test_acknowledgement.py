"""Input and output acknowledgement (Falkirk Wheel §4.3) on a real pipeline: when the source may forget its input,
when the sink's epochs count, and what the monitor reclaims, step by step.

The pipeline (``spark_jobs/readings``, real Spark and Delta tables, run in-process through
the runtime's own context and commit): ``intake`` (Ephemeral) reads an inbox,
``tally`` (lazy checkpoint, durable every epoch) keeps running totals, ``deliver``
(Ephemeral) sends them to an outbox whose reader accepts them by receipt. G1a: tally
discards its output (scratch only); G1b: tally logs it durably.

The spec's steps, with the monitor (:func:`falkirk.policies.planning.collector.collect`) run after each:

* T1: intake has sealed epochs 1 and 2; tally has no checkpoint yet;
* T2: tally checkpoints epoch 1 (and deliver sends epoch 1, not yet accepted);
* T3: the outbox accepts epoch 1, and the delivery is reported;
* T4: tally checkpoints epoch 2 (and deliver sends epoch 2, not yet accepted).

After T4 the whole scratch tier is lost, and the recovery the solver plans runs and
ends with the outbox holding exactly what a failure-free run would send: nothing it needed
was acknowledged away or collected.
"""

from __future__ import annotations

import shutil
from collections import defaultdict

import pytest

from falkirk.policies import Ledger, StoreConfig
from falkirk.policies.job_spec import JobSpec
from falkirk.policies.planning.collector import collect
from falkirk.policies.planning.recovery import LostScratch, plan_recovery
from falkirk.policies.store.control import Collections, Deliveries
from falkirk.policies.store.readability import StoreReadability
from falkirk.spark_jobs.inbox import ARCHIVE_DIR, Inbox, InboxError
from falkirk.spark_jobs.outbox import Outbox, report_deliveries
from falkirk.spark_jobs.readings import (GRAPH, deliver as deliver_job, intake as intake_job, location, reading,
    regimes, tally as tally_job)
from falkirk.spark_jobs.runtime import EpochContext, commit

JOBS = {"intake": intake_job.compute, "tally": tally_job.compute, "deliver": deliver_job.compute}
INPUTS = {"intake": (), "tally": ("intake",), "deliver": ("tally",)}
READINGS = 12

# Per step: low-watermarks (intake / tally / deliver, as last epochs), the input acknowledged
# through, and what that step's collection reclaims: (task, table, tier) -> epochs.
G1A = {
    "T1": ((0, 0, 0), 0, {}),
    "T2": ((0, 0, 0), 0, {}),  # tally is blocked: deliver has no accepted epoch
    "T3": ((1, 1, 1), 1, {("intake", "output", "scratch"): (1,), ("tally", "output", "scratch"): (1,)}),
    "T4": ((1, 1, 1), 1, {}),  # still blocked on the outbox
}
G1B = {
    "T1": ((0, 0, 0), 0, {}),
    "T2": ((1, 1, 0), 1, {("intake", "output", "scratch"): (1,)}),  # input acknowledged before the output
    "T3": ((1, 1, 1), 1, {("tally", "output", "durable"): (1,)}),  # tally trims its log at epoch 1
    "T4": ((2, 2, 1), 2, {("intake", "output", "scratch"): (2,), ("tally", "state", "durable"): (1,),
                          ("tally", "state", "scratch"): (1,)}),  # and collects its checkpoint of epoch 1
}


def expected_totals(epoch: int) -> list[dict[str, object]]:
    """What a failure-free run sends for ``epoch``: kWh per meter over valid readings so far."""
    totals: dict[str, int] = defaultdict(int)
    for e in range(1, epoch + 1):
        for r in (reading(e, i) for i in range(READINGS)):
            if int(r["kwh"]) > 0:
                totals[str(r["meter"])] += int(r["kwh"])
    return [{"epoch": epoch, "kwh": kwh, "meter": m} for m, kwh in sorted(totals.items())]


@pytest.mark.parametrize("variant", ["g1a", "g1b"])
def test_scenario_g1_acknowledgements_and_collection_step_by_step(spark, tmp_path, monkeypatch, capsys,
                                                                  variant: str) -> None:
    from falkirk.plugins.cli import main

    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    for k, v in store.env().items():
        monkeypatch.setenv(k, v)
    dag, logs = variant, variant == "g1b"
    table = G1B if logs else G1A
    ledger = Ledger(store)
    inbox = Inbox(location("FALKIRK_READINGS_INBOX", store.durable_uri, dag, "inbox"), policy="archive")
    outbox = Outbox(location("FALKIRK_READINGS_OUTBOX", store.durable_uri, dag, "outbox"))
    for epoch in (1, 2):
        inbox.deliver(epoch, [reading(epoch, i) for i in range(READINGS)])

    def run(task: str, epoch: int) -> None:
        spec = JobSpec(dag_id=dag, task_id=task, epoch=epoch, regime=regimes(logs)[task], run_id=f"epoch-{epoch}", inputs=INPUTS[task],
                       incarnation=ledger.invalidations.next_incarnation(dag, task, epoch))
        ctx = EpochContext(spec, store, ledger, spark)
        commit(ctx, JOBS[task](ctx))

    def step(name: str) -> None:
        report = collect(store, dag, GRAPH, retain_hours=0, acknowledge={"intake": inbox.acknowledge})
        marks, acked, reclaimed = table[name]
        got = {(r.task_id, r.what, r.uri[len(str(tmp_path)) + 1:].split("/")[0]): r.epochs
               for r in report.plan.tables}
        assert tuple(report.plan.watermarks[t] for t in GRAPH.tasks) == marks, (name, report.plan.describe())
        assert got == reclaimed, (name, report.plan.describe())
        # The source forgets exactly the epochs inside its low-watermark, archived, not before.
        assert inbox.acknowledged == acked, name
        assert inbox.pending() == [e for e in (1, 2) if e > acked], name
        archived = sorted(p.name for p in (inbox.root / ARCHIVE_DIR).glob("*.jsonl")) if acked else []
        assert archived == [inbox.path(e).name for e in range(1, acked + 1)], name

    run("intake", 1)
    run("intake", 2)
    step("T1")
    run("tally", 1)
    run("deliver", 1)
    assert outbox.batch(1) == expected_totals(1) and outbox.accepted_through() == 0
    step("T2")  # an epoch sent but not accepted is no checkpoint of deliver
    outbox.accept(1)
    if logs:  # the reader calls back through the command line ...
        assert main(["delivered", "--dag", dag, "--task", "deliver", "--through", "1"]) == 0
        assert "deliver: delivered through epoch 1" in capsys.readouterr().out
    else:  # ... or the sink collects the receipts itself
        assert report_deliveries(ledger, dag, "deliver", outbox) == 1
    step("T3")
    run("tally", 2)
    run("deliver", 2)
    step("T4")
    # The checkpoints collected in G1b are marked in the ledger; G1a keeps everything.
    assert Collections(ledger.store).through(dag) == ({"intake": 1, "tally": 1} if logs else {})
    if logs:
        with pytest.raises(InboxError, match="acknowledged"):
            inbox.read(2)

    # Every scratch copy is lost; the planned recovery needs only what the monitor kept.
    shutil.rmtree(f"{store.scratch_uri}/{dag}")
    p = plan_recovery(dag, GRAPH, ledger.entries(dag), [LostScratch(f"{store.scratch_uri}/{dag}")], 2,
                      StoreReadability(store))
    reruns = {t.task_id: t.rerun for t in p.tasks if t.rerun}
    # deliver's epoch 2 was never accepted, so it is sent again in both variants.
    assert reruns == ({"deliver": (2,)} if logs else {"intake": (2,), "tally": (2,), "deliver": (2,)})
    assert p.task("deliver").kept_through == 1
    if not logs:
        assert p.task("tally").restore_from.epoch == 1
    ledger.invalidations.record([e for e in ledger.entries(dag) if (e.task_id, e.epoch) in p.rerun_set()], p.plan_id)
    for task in GRAPH.tasks:
        if 2 in reruns.get(task, ()):
            run(task, 2)
    assert [outbox.batch(e) for e in (1, 2)] == [expected_totals(1), expected_totals(2)]
    assert outbox.accepted_through() == 1  # the re-sent batch waits for its own receipt


def test_bad_delivery_reports_are_refused_and_change_nothing(spark, tmp_path, monkeypatch, capsys) -> None:
    from falkirk.plugins.cli import main

    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    for k, v in store.env().items():
        monkeypatch.setenv(k, v)
    ledger = Ledger(store)
    inbox = Inbox(location("FALKIRK_READINGS_INBOX", store.durable_uri, "bad", "inbox"))
    inbox.deliver(1, [reading(1, i) for i in range(READINGS)])
    for task in GRAPH.tasks:
        spec = JobSpec(dag_id="bad", task_id=task, epoch=1, regime=regimes(False)[task], run_id="epoch-1", inputs=INPUTS[task])
        ctx = EpochContext(spec, store, ledger, spark)
        commit(ctx, JOBS[task](ctx))
    [row] = ledger.entries("bad", "deliver")
    assert [(o.name, o.tier, o.rows) for o in row.outputs] == [("delivered", "external", len(expected_totals(1)))]

    for argv, message in [
        (["--task", "deliver", "--through", "2"], "committed epochs only through 1"),
        (["--task", "tally", "--through", "1"], "has sent nothing to an external system; tasks that do: ['deliver']"),
        (["--task", "deliver", "--through", "0"], "through=0"),
    ]:
        assert main(["delivered", "--dag", "bad", *argv]) == 2
        assert message in capsys.readouterr().err
    assert Deliveries(ledger.store).through("bad") == {}
    assert main(["delivered", "--dag", "bad", "--task", "deliver", "--through", "1"]) == 0
    assert main(["delivered", "--dag", "bad", "--task", "deliver", "--through", "1"]) == 0  # idempotent
    assert "(unchanged)" in capsys.readouterr().out and Deliveries(ledger.store).through("bad") == {"deliver": 1}
