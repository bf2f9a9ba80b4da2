"""Two DAGs joined by an Asset, through the real scheduler.

``falkirk_orders``' ``publish`` updates the Asset ``falkirk_orders.ranking`` with each committed
epoch, the epoch's date as the event's partition key; ``falkirk_orders_leaders`` is scheduled on
it with ``PartitionedAssetTimetable``: one run per producer epoch, on the same epoch clock. Its
stateful ``leaders`` reads the ranking through ``ctx.read_asset``.

Epochs 1-6 of ``falkirk_orders`` run; each starts one run of ``leaders``, whose ledger row
records the producer epoch and incarnation it read. Then a recovery in ``falkirk_orders``
redoes ``publish`` 3 (a bad epoch): its replacement event starts a second run of leaders' epoch
3, which is refused, naming the read that was replaced and the plan that redoes leaders from
it; the ledgers show which of leaders' checkpoints read the replaced incarnation. A recovery of
leaders from that epoch re-runs 3 and 4, which read the redo, and leaves every table equal to
the failure-free run.

Then ``falkirk_orders``' epoch 3 input is delivered wrong (``INGEST_JOB``), redone, then
corrected, and each time recovered by one plan across both DAGs,
replayed producers first: the consumer's epochs re-run only once the producer's redone epochs
are committed, and the runs Airflow starts on the redone epochs' events are settled; the same
from the Falkirk view (a browser, with screenshots), and for a lost scratch tier of
``aggregate`` (here under ``LazyCheckpoint(every=4)``). The control runs the same two DAGs as
plain Airflow tasks, where clearing the producer's bad epoch leaves the consumer stale.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from devstack.airflow import USERS, AirflowStack
from devstack.demo import DAG_ID, dag_epoch_clock, run_epochs, run_id_of
from devstack.spark import SparkConnectServer
from falkirk.plugins.asset_recovery import plan_across, replay_across
from falkirk.plugins.outlet_events import emit_missing_events
from falkirk.plugins.recovery import plan, replay
from falkirk.policies.asset_events import CommittedEpoch, epoch_partition_key
from falkirk.policies.planning.assets import asset_edges, stale_reads
from falkirk.policies.planning.recovery import BadEpoch, FailedTask, PlanError
from falkirk.policies.regimes import Tier
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import AssetInput, Ledger
from tests.integration.browser import ARTIFACTS, chromium, shot, sign_in
from tests.oracle import canonical
from tests.tables import table_rows

pytestmark = pytest.mark.integration

LEADERS = "falkirk_orders_leaders"
LINEAGE_FILE, LINEAGE_NAMESPACE = "lineage.jsonl", "falkirk_assets"
ASSET = "falkirk_orders.ranking"
EPOCHS = [1, 2, 3, 4, 5, 6]


ROOT = Path(__file__).resolve().parents[2]
# falkirk_orders with its stateful aggregate under LazyCheckpoint(every=4): its state of epochs 1-3,
# 5, 6 is in scratch only, so a lost scratch tier rolls it back to epoch 4
LAZY_AGGREGATE = ("regime=EagerCheckpoint(),  # keeps state", "regime=LazyCheckpoint(every=4),  # keeps state")


# falkirk_orders' ingest, reading a source whose epochs can be delivered wrong and corrected:
# while the file bad/EPOCH exists beside the job, that epoch's orders come with bob's amounts at 1000.
INGEST_JOB = '''"""ingest (Ephemeral), as falkirk_orders' own, from a source whose epochs can be wrong."""
from pathlib import Path

from pyspark.sql import functions as F

from falkirk.spark_jobs.pipeline.ingest import SCHEMA
from falkirk.spark_jobs.pipeline.source import orders_for_epoch
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

BAD = Path(__file__).resolve().parent / "bad"


def compute(ctx: EpochContext) -> EpochResult:
    orders = orders_for_epoch(ctx.epoch)
    if (BAD / str(ctx.epoch)).exists():
        orders = [dict(o, amount=1000) if o["customer"] == "bob" else o for o in orders]
    valid = ctx.spark.createDataFrame(orders, schema=SCHEMA).where(F.col("amount") > 0)
    return EpochResult(outputs={"output": valid})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
'''
INGEST = 'application=f"{JOBS}.ingest"'


def _dags_folder(root: Path) -> Path:
    """The two DAGs, falkirk_orders' aggregate under LazyCheckpoint(every=4) and its ingest
    reading ``INGEST_JOB``'s source, and the control's two."""
    folder = root / "dags"
    folder.mkdir()
    (root / "jobs").mkdir()
    (root / "jobs" / "ingest.py").write_text(INGEST_JOB)
    orders = (ROOT / "dags" / "falkirk_orders.py").read_text()
    assert LAZY_AGGREGATE[0] in orders and INGEST in orders
    orders = orders.replace(*LAZY_AGGREGATE).replace("import Batch, EagerCheckpoint,", "import Batch, LazyCheckpoint,")
    orders = orders.replace(INGEST, f"application={str(root / 'jobs' / 'ingest.py')!r}")
    (folder / "falkirk_orders.py").write_text(orders)
    (folder / "falkirk_orders_leaders.py").write_text((ROOT / "dags" / "falkirk_orders_leaders.py").read_text())
    (folder / "plain_dags.py").write_text(CONTROL_DAGS.format(root=str(root / "plain")))
    return folder


# The control: the same two DAGs as Airflow alone would run them, plain tasks joined by an
# Asset, each producer epoch's event keyed by its date. publish ranks the customers by the
# epoch's valid orders (a marker file makes an epoch's input bad: bob's amounts 1000); leaders
# counts, per customer, the epochs in the top three, in a state file it reads and rewrites.
CONTROL_DAGS = '''"""Airflow DAG file: the control, plain Airflow tasks (no Falkirk) joined by an Asset."""
import json
from datetime import datetime, timezone
from pathlib import Path

from airflow.sdk import DAG, Asset, PartitionedAssetTimetable, task

ROOT = Path({root!r})
RANKING = Asset("plain.ranking")
FIRST = datetime(2026, 1, 1, tzinfo=timezone.utc)
KEY = "%Y-%m-%dT%H:%M:%S"


def epoch_of(date):
    return (date - FIRST).days + 1


with DAG("plain_orders", schedule=None, start_date=FIRST, catchup=False, max_active_runs=1):
    @task(outlets=[RANKING])
    def publish(**context):
        from falkirk.spark_jobs.pipeline.source import orders_for_epoch

        date = context["dag_run"].logical_date
        e = epoch_of(date)
        orders = orders_for_epoch(e)
        if (ROOT / "bad" / str(e)).exists():
            orders = [dict(o, amount=1000) if o["customer"] == "bob" else o for o in orders]
        totals = {{}}
        for o in orders:
            if o["amount"] > 0:
                totals[o["customer"]] = totals.get(o["customer"], 0) + o["amount"]
        (ROOT / "publish").mkdir(parents=True, exist_ok=True)
        (ROOT / "publish" / f"{{e}}.json").write_text(json.dumps(sorted(totals, key=lambda c: (-totals[c], c))))
        context["outlet_events"][RANKING].add_partitions(date.strftime(KEY))

    publish()

with DAG("plain_leaders", schedule=PartitionedAssetTimetable(assets=RANKING), start_date=FIRST, catchup=False,
         max_active_runs=1):
    @task
    def leaders(**context):
        e = epoch_of(datetime.strptime(context["dag_run"].partition_key, KEY).replace(tzinfo=timezone.utc))
        top = json.loads((ROOT / "publish" / f"{{e}}.json").read_text())[:3]
        path = ROOT / "leaders" / "state.json"
        state = json.loads(path.read_text()) if path.exists() else {{}}
        for c in top:
            state[c] = state.get(c, 0) + 1
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(state, sort_keys=True))
        (ROOT / "leaders" / f"{{e}}.json").write_text(json.dumps(state, sort_keys=True))

    leaders()
'''


# Every table of the two DAGs: (DAG, task/table, tier)
TABLES = ((DAG_ID, "ingest/output", Tier.SCRATCH), (DAG_ID, "aggregate/output", Tier.SCRATCH),
          (DAG_ID, "aggregate/state", Tier.SCRATCH), (DAG_ID, "aggregate/state", Tier.DURABLE),
          (DAG_ID, "publish/output", Tier.DURABLE), (LEADERS, "leaders/state", Tier.DURABLE),
          (LEADERS, "leaders/output", Tier.DURABLE))


def _tables(store: StoreConfig, epochs: range = range(1, 7)) -> dict[str, list[tuple]]:
    """Every table of the two DAGs, exactly (the rows of ``epochs``): ingest's and aggregate's
    scratch outputs, aggregate's checkpoints in both tiers, publish's ranking, leaders' state and
    output."""
    def rows(dag: str, name: str, tier: Tier) -> list[tuple]:
        return canonical([{k: v for k, v in r.items() if not k.startswith("_")}
                          for r in table_rows(store, name, dag_id=dag, tier=tier) if r["epoch"] in epochs])
    return {f"{name} ({tier.value})": rows(dag, name, tier) for dag, name, tier in TABLES}


@pytest.fixture(scope="module")
def joined(tmp_path_factory: pytest.TempPathFactory, spark_connect: SparkConnectServer):
    root = tmp_path_factory.mktemp("assets")
    store = StoreConfig(durable_uri=str(root / "durable"), scratch_uri=str(root / "scratch"))
    # OpenLineage on, its events appended to a file: lineage.jsonl beside the Airflow home
    lineage = {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "append": True,
                                                              "log_file_path": str(root / LINEAGE_FILE)}),
               "AIRFLOW__OPENLINEAGE__NAMESPACE": LINEAGE_NAMESPACE}
    # crash points a test arms while Airflow runs: the file "faults" beside the Airflow home
    faults = {"FALKIRK_CRASH_AT": f"@{root / 'faults'}"}
    stack = AirflowStack(home=root / "airflow", store=store,
                         extra_env={**spark_connect.airflow_env(), **lineage, **faults}, dags_folder=_dags_folder(root))
    stack.init()
    stack.start()
    try:
        client = stack.client()
        client.wait_for_dag(LEADERS)
        client.set_paused(LEADERS, False)
        states = run_epochs(client, dag_epoch_clock(), EPOCHS, progress=print)
        assert states == {e: "success" for e in EPOCHS}
        runs = _leaders_runs(stack, len(EPOCHS))
        for run in runs:
            assert client.wait_for_run(LEADERS, run["dag_run_id"], timeout=600) == "success"
        # the failure-free run: every recovery below must leave these tables exactly so
        reference = _tables(store)
        assert all(reference.values()), {name: len(rows) for name, rows in reference.items()}
        yield stack, store, client, reference
    finally:
        stack.stop()


def _leaders_runs(stack: AirflowStack, count: int, timeout: float = 300) -> list[dict]:
    """leaders' DAG runs, oldest first, once there are ``count`` of them."""
    from devstack.processes import wait_until

    client = stack.client()
    found: list[dict] = []

    def enough() -> bool:
        found[:] = client.request("GET", f"/api/v2/dags/{LEADERS}/dagRuns",
                                  params={"order_by": "run_after", "limit": 100})["dag_runs"]
        return len(found) >= count

    wait_until(f"{count} runs of {LEADERS}", enough, timeout=timeout)
    return list(found)


def _oracle(ranking: list[dict], epochs: list[int]) -> list[tuple]:
    """leaders' state after ``epochs``, computed from publish's rows in Python."""
    on_top: dict[str, list[int]] = {}
    for row in ranking:
        if row["epoch"] in epochs and row["rank"] <= 3:
            on_top.setdefault(row["customer"], []).append(row["rank"])
    return sorted((c, len(ranks), min(ranks)) for c, ranks in on_top.items())


def _state(store: StoreConfig, epoch: int, table: str = "state") -> list[tuple]:
    rows = table_rows(store, f"leaders/{table}", dag_id=LEADERS, tier=Tier.DURABLE)
    return sorted((r["customer"], r["epochs_on_top"], r["best_rank"]) for r in rows if r["epoch"] == epoch)


def test_each_producer_epoch_starts_one_consumer_run_that_records_what_it_read(joined) -> None:
    stack, store, client, reference = joined
    runs = _leaders_runs(stack, len(EPOCHS))
    assert [r["partition_key"] for r in runs] == [epoch_partition_key(dag_epoch_clock().logical_date(e))
                                                  for e in EPOCHS]
    assert all(r["logical_date"] is None for r in runs)
    rows = Ledger(store).entries(LEADERS, "leaders")
    assert [(r.epoch, r.run_id, r.asset_inputs) for r in rows] == [
        (e, runs[e - 1]["dag_run_id"], (AssetInput(asset=ASSET, dag_id=DAG_ID, task_id="publish", output="output", epoch=e, incarnation=0),)) for e in EPOCHS]
    [edge] = asset_edges(rows)
    assert (edge.producer_dag, edge.producer_task, edge.consumer_dag, edge.consumer_task, edge.consumed) == (
        DAG_ID, "publish", LEADERS, "leaders", {e: (e,) for e in EPOCHS})
    ranking = table_rows(store, "publish/output")
    for e in EPOCHS:
        assert _state(store, e) == _oracle(ranking, list(range(1, e + 1))), f"leaders' state of epoch {e}"


def test_a_producer_redo_leaves_the_consumer_visibly_stale_and_its_recovery_reads_the_redo(joined) -> None:
    stack, store, client, reference = joined
    before = {e: _state(store, e) for e in EPOCHS}
    redo = plan(DAG_ID, store, client, bad_epochs=[("publish", 3)])
    assert {(t, e) for t, e in redo.rerun_set()} == {("publish", 3)}
    replay(redo.plan_id, store, client, holder="admin")
    publish = Ledger(store).entries(DAG_ID, "publish")
    assert [(r.epoch, r.incarnation) for r in publish] == [(e, int(e == 3)) for e in EPOCHS]
    # Airflow's own answer: the replacement event starts leaders' epoch 3 again, which alone
    # would leave epoch 4 built on the old ranking; the job refuses it, naming the replaced read
    # and the plan, so the run fails, visibly.
    runs = _leaders_runs(stack, len(EPOCHS) + 1)
    again = runs[-1]
    assert again["partition_key"] == runs[2]["partition_key"]
    assert client.wait_for_run(LEADERS, again["dag_run_id"], timeout=600) == "failed"
    log = client.task_log(LEADERS, again["dag_run_id"], "leaders", 1)
    assert ("leaders epoch 3 read falkirk_orders.publish epoch 3 as incarnation 0, which a recovery there has "
            "replaced") in log, log[-2000:]
    assert f"falkirk plan --dag {LEADERS} --bad-epoch leaders:3 (re-runs 4 task instances" in log, log[-2000:]
    # The ledgers name the stale checkpoint: leaders' epoch 3 read publish 3 as incarnation 0.
    stale = stale_reads(Ledger(store).entries(LEADERS, "leaders"), publish)
    assert [(row.epoch, read.epoch, read.incarnation) for row, read in stale] == [(3, 3, 0)]
    # Planned from the failed run itself, as from its failure in the grid: that run has no
    # ledger row and no logical date (Airflow started it on the replacement's event), so its
    # epoch is the one its partition key names.
    by_failure = plan(LEADERS, store, client, failed_tasks=["leaders"], stale_inputs=True, record=False)
    assert FailedTask("leaders", 3) in by_failure.failures
    assert {(t, e) for t, e in by_failure.rerun_set()} == {("leaders", e) for e in range(3, 7)}
    # Recovered from that epoch, leaders re-runs 3 to 6 (it keeps state), reading the redo.
    fix = plan(LEADERS, store, client, stale_inputs=True)
    assert fix.failures == plan(LEADERS, store, client, bad_epochs=[("leaders", 3)], record=False).failures
    assert {(t, e) for t, e in fix.rerun_set()} == {("leaders", e) for e in range(3, 7)}
    replay(fix.plan_id, store, client, holder="admin", timeout=900)  # as `falkirk replay` does
    rows = Ledger(store).entries(LEADERS, "leaders")
    assert [(r.epoch, r.incarnation, [(a.epoch, a.incarnation) for a in r.asset_inputs]) for r in rows] == [
        (e, int(e >= 3), [(e, int(e == 3))]) for e in EPOCHS]
    assert stale_reads(rows, publish) == []
    # Nothing is stale any more: asked alone, that is an error; beside a failure, it adds nothing.
    with pytest.raises(PlanError, match="--stale-inputs: no checkpoint of falkirk_orders_leaders read an epoch"):
        plan(LEADERS, store, client, stale_inputs=True, record=False)
    beside = plan(LEADERS, store, client, bad_epochs=[("leaders", 6)], stale_inputs=True, record=False)
    assert (beside.failures, beside.rerun_set()) == ((BadEpoch("leaders", 6),), {("leaders", 6)})
    # The run Airflow started on the replacement's event, refused before this plan was made, is
    # marked success once the plan has redone its epoch in the run the ledger names, so the DAG
    # shows no failed run left over.
    again = client.dag_run(LEADERS, again["dag_run_id"])
    assert (again["state"], runs[2]["dag_run_id"] == rows[2].run_id) == ("success", True)
    assert f"epoch 3 was redone by plan {fix.plan_id} in run {rows[2].run_id}" in again["note"], again["note"]
    # publish is deterministic: its redo holds the same ranking, and so do leaders' redone epochs
    assert {e: _state(store, e) for e in EPOCHS} == before
    assert {e: _state(store, e, "output") for e in EPOCHS} == before
    assert _tables(store) == reference


def test_one_plan_across_both_dags_redoes_a_bad_producer_epoch_and_every_consumer_epoch_that_read_it(
        joined, monkeypatch, capsys) -> None:
    from falkirk.plugins.cli import main

    stack, store, client, reference = joined
    for k, v in {**store.env(), "FALKIRK_AIRFLOW_URL": stack.base_url, "FALKIRK_AIRFLOW_USER": "admin",
                 "FALKIRK_AIRFLOW_PASSWORD": "admin"}.items():
        monkeypatch.setenv(k, v)
    before = {e: _state(store, e) for e in EPOCHS}
    # Epoch 3's input turns out to have been delivered wrong: bob's amounts at 1000. Redone on it
    # (one plan across both DAGs, as below), bob tops the ranking from epoch 3 on, and leaders,
    # which read the ranking through the Asset, follows, epoch for epoch.
    bad = Path(stack.home).parent / "jobs" / "bad"
    bad.mkdir(exist_ok=True)
    (bad / "3").touch()
    wrong = plan_across(DAG_ID, store, client, bad_epochs=[("ingest", 3)])
    replay_across([p.plan_id for p in wrong.plans], store, client, holder="admin", timeout=900)
    ranking = table_rows(store, "publish/output")
    assert [r["customer"] for r in ranking if r["epoch"] == 3 and r["rank"] == 1] == ["bob"]
    for e in EPOCHS:
        assert _state(store, e) == _oracle(ranking, list(range(1, e + 1))), f"leaders' state of epoch {e}"
        assert (_state(store, e) == before[e]) == (e < 3), f"leaders' state of epoch {e}"
    assert _tables(store) != reference
    # The input is corrected: the same plan across both DAGs redoes what read it.
    (bad / "3").unlink()
    earlier = len(_leaders_runs(stack, len(EPOCHS) + 5))
    across = plan_across(DAG_ID, store, client, bad_epochs=[("ingest", 3)], record=False)
    assert main(["plan", "--dag", DAG_ID, "--bad-epoch", "ingest:3", "--consumers"]) == 0
    out = capsys.readouterr().out
    assert across.table() in out and "re-runs 13 task instances in 2 DAGs (falkirk_orders, falkirk_orders_leaders)" in out
    ids = [p.plan_id for p in across.plans]
    assert f"execute it with: falkirk replay {ids[0]} {ids[1]}" in out
    # By hand: ingest (ephemeral) redoes 3; aggregate (eager) read it, restores its epoch 2 and
    # redoes 3-6; publish (batch) reads aggregate's 3-6 again. leaders' runs 3-6 read publish 3-6
    # (one producer epoch per run): leaders restores its epoch 2 and redoes 3-6.
    assert across.dags() == (DAG_ID, LEADERS)
    assert across.rerun_set() == {(DAG_ID, "ingest", 3), *((LEADERS, "leaders", e) for e in range(3, 7)),
                                  *((DAG_ID, t, e) for t in ("aggregate", "publish") for e in range(3, 7))}
    assert across.plan(LEADERS).task("leaders").restore_from.epoch == 2
    assert across.plan(DAG_ID) == plan(DAG_ID, store, client, bad_epochs=[("ingest", 3)], record=False)
    # the viewer may clear nothing: the replay stops before anything runs, naming the DAG
    monkeypatch.setenv("FALKIRK_AIRFLOW_USER", "viewer")
    monkeypatch.setenv("FALKIRK_AIRFLOW_PASSWORD", USERS["viewer"][1])
    assert main(["replay", *ids]) == 2
    assert f"plan {ids[0]} re-runs task instances of {DAG_ID}, which Airflow does not let this user clear" in \
        capsys.readouterr().err
    assert [(r.epoch, r.incarnation) for r in Ledger(store).entries(DAG_ID, "publish")] == [
        (1, 0), (2, 0), (3, 2), (4, 1), (5, 1), (6, 1)]  # nothing invalidated
    monkeypatch.setenv("FALKIRK_AIRFLOW_USER", "admin")
    monkeypatch.setenv("FALKIRK_AIRFLOW_PASSWORD", "admin")
    assert main(["replay", *ids]) == 0
    out = capsys.readouterr().out
    print(out)
    # leaders' replay started once falkirk_orders' had ended, and after Airflow's second runs of
    # leaders 3-6 (started on the redone epochs' events) had ended, refused
    assert out.index(f"plan {ids[0]}: done, 9 task instances re-ran") < out.index(
        f"{LEADERS}: waiting for the runs Airflow starts") < out.index(f"plan {ids[1]}: invalidated 4 ledger rows")
    assert f"plan {ids[1]}: done, 4 task instances re-ran" in out and "replaying now" not in out
    # each DAG's history names the other DAG's plan of the same recovery
    history = {dag: client.request("GET", f"/falkirk/api/v1/dags/{dag}/recoveries")["recoveries"][0]
               for dag in (DAG_ID, LEADERS)}
    assert [(h["plan_id"], h["outcome"], h["across"]) for h in history.values()] == [
        (ids[0], "finished", [{"dag_id": LEADERS, "plan_id": ids[1]}]),
        (ids[1], "finished", [{"dag_id": DAG_ID, "plan_id": ids[0]}])]
    publish = Ledger(store).entries(DAG_ID, "publish")
    assert [(r.epoch, r.incarnation) for r in publish] == [(1, 0), (2, 0), (3, 3), (4, 2), (5, 2), (6, 2)]
    rows = Ledger(store).entries(LEADERS, "leaders")
    assert [(r.epoch, r.incarnation, [(a.epoch, a.incarnation) for a in r.asset_inputs]) for r in rows] == [
        (1, 0, [(1, 0)]), (2, 0, [(2, 0)]), (3, 3, [(3, 3)]), (4, 3, [(4, 2)]), (5, 3, [(5, 2)]), (6, 3, [(6, 2)])]
    assert stale_reads(rows, publish) == []
    # Airflow started leaders 3-6 again on the redone epochs' events: refused while leaders
    # still read the replaced epochs, then marked success, naming the plan that redid them.
    second = _leaders_runs(stack, earlier + 4)[earlier:]
    assert [(r["partition_key"], r["state"]) for r in second] == [
        (epoch_partition_key(dag_epoch_clock().logical_date(e)), "success") for e in range(3, 7)]
    assert all(f"plan {ids[1]}" in r["note"] for r in second), [r["note"] for r in second]
    assert {e: _state(store, e) for e in EPOCHS} == before
    assert {e: _state(store, e, "output") for e in EPOCHS} == before
    assert _tables(store) == reference

    # An event that arrives after the recovery (publish 4's redo, sent again): Airflow starts
    # leaders 4 once more, and its job finds the event already read, and does nothing.
    [asset] = [a for a in client.request("GET", "/api/v2/assets", params={"name_pattern": ASSET})["assets"]
               if a["name"] == ASSET]
    key = epoch_partition_key(dag_epoch_clock().logical_date(4))
    client.request("POST", "/api/v2/assets/events", json={
        "asset_id": asset["id"], "partition_key": key, "extra": CommittedEpoch.from_entry(publish[3]).extra()})
    late = _leaders_runs(stack, earlier + 5)[-1]
    assert late["partition_key"] == key
    assert client.wait_for_run(LEADERS, late["dag_run_id"], timeout=300) == "success"
    log = client.task_log(LEADERS, late["dag_run_id"], "leaders", 1)
    assert f"leaders epoch 4: run {rows[3].run_id} already read every asset event of this run" in log, log[-2000:]
    assert Ledger(store).entries(LEADERS, "leaders") == rows
    # and falkirk_orders' garbage collection keeps publish's output whole: leaders reads it again
    # in a recovery there
    from falkirk.policies.planning.collector import collect

    products = collect(store, DAG_ID, dry_run=True, retain_hours=0).plan.products
    assert ("publish", "output", f"read through an Asset by {LEADERS}") in {(p.task_id, p.output, p.why) for p in products}


# -- the view --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    yield from chromium()


def _view(browser, stack: AirflowStack, user: str, dag: str):
    """A page signed in as ``user``, on ``dag``'s Falkirk view."""
    context, page = sign_in(browser, stack.base_url, user)
    page.goto(f"{stack.base_url}/dags/{dag}/plugin/falkirk")
    page.get_by_test_id("falkirk-view").wait_for(timeout=60_000)
    return context, page


def _pick_bad_epoch(page, task: str, epoch: int) -> None:
    page.get_by_test_id("bad-task").select_option(task)
    page.get_by_test_id("bad-epoch").fill(str(epoch))
    page.get_by_test_id("add-bad-epoch").click()
    page.get_by_test_id("across").wait_for(timeout=60_000)


def test_the_view_shows_the_plan_across_dags_and_replays_both_from_the_producers_page(joined, browser) -> None:
    stack, store, client, reference = joined
    before = {e: _state(store, e) for e in EPOCHS}
    consumer = f"across-{LEADERS}-leaders"
    # viewer: sees both DAGs' re-runs, and that it may replay neither
    context, page = _view(browser, stack, "viewer", DAG_ID)
    try:
        _pick_bad_epoch(page, "ingest", 3)
        assert page.get_by_test_id(consumer).get_attribute("data-rerun") == "3,4,5,6"
        assert page.get_by_test_id(f"across-may-{LEADERS}").inner_text() == "may not clear its task instances"
        assert page.get_by_test_id("replay-button").is_disabled()
        shot(page, "across-dags-viewer")
    finally:
        context.close()
    # admin: the same plan, which it may replay; one click replays falkirk_orders, then leaders
    context, page = _view(browser, stack, "admin", DAG_ID)
    try:
        _pick_bad_epoch(page, "ingest", 3)
        assert page.get_by_test_id("rerun-count").inner_text() == "9"
        assert page.get_by_test_id("across-count").inner_text() == "4"
        assert page.get_by_test_id(f"across-may-{LEADERS}").inner_text() == "may replay it"
        shot(page, "across-dags-admin-preview")
        page.get_by_test_id("panel-plan").screenshot(path=str(ARTIFACTS / "across-dags-plan.png"))
        page.get_by_test_id("replay-button").click()
        assert f"Then, once those are committed: {LEADERS}, 4 task instances." in \
            page.get_by_test_id("confirm-across").inner_text()
        page.get_by_test_id("confirm-replay").click()
        started = page.get_by_test_id("replay-started")
        started.wait_for(timeout=60_000)
        assert f"Then: {LEADERS} (plan " in started.inner_text()
        shot(page, "across-dags-admin-started")
    finally:
        context.close()
    from devstack.processes import wait_until

    def caught_up() -> bool:
        return [r.incarnation for r in Ledger(store).entries(LEADERS, "leaders")] == [0, 0, 4, 4, 4, 4]

    wait_until("leaders' epochs 3-6 redone by the view's recovery", caught_up, timeout=600)
    # the consumer's view: its history names the producer's plan it followed
    context, page = _view(browser, stack, "admin", LEADERS)
    try:
        [latest] = [r for r in client.request("GET", f"/falkirk/api/v1/dags/{LEADERS}/recoveries")["recoveries"][:1]]
        across = page.get_by_test_id(f"history-across-{latest['plan_id']}")
        across.wait_for(timeout=60_000)
        assert across.inner_text().startswith(f"with {DAG_ID} (plan ")
        shot(page, "across-dags-consumer-history")
    finally:
        context.close()
    publish = Ledger(store).entries(DAG_ID, "publish")
    assert [(r.epoch, r.incarnation) for r in publish] == [(1, 0), (2, 0), (3, 4), (4, 3), (5, 3), (6, 3)]
    rows = Ledger(store).entries(LEADERS, "leaders")
    assert [[(a.epoch, a.incarnation) for a in r.asset_inputs] for r in rows[2:]] == [
        [(3, 4)], [(4, 3)], [(5, 3)], [(6, 3)]]
    assert {e: _state(store, e) for e in EPOCHS} == before
    assert _tables(store) == reference


def test_a_lost_scratch_tier_of_the_producers_stateful_task_is_recovered_across_both_dags(joined, capsys) -> None:
    import shutil

    stack, store, client, reference = joined
    scratch = Path(store.scratch_uri) / DAG_ID
    shutil.rmtree(scratch)  # the worker's disk: ingest's outputs, aggregate's outputs and its scratch state
    across = plan_across(DAG_ID, store, client, lost_scratch=[str(scratch)])
    # By hand: aggregate's newest checkpoint left is its durable epoch 4 (every=4); it redoes 5 and
    # 6, whose inputs (ingest's scratch outputs) are gone: ingest (ephemeral) reads its source
    # again for 5 and 6. publish redoes 5 and 6 from the redone aggregate; its logged epochs 1-4
    # stand. leaders' runs 5 and 6 read publish 5 and 6: leaders restores its epoch 4, redoes 5, 6.
    assert across.rerun_set() == {(d, t, e) for d, t in ((DAG_ID, "ingest"), (DAG_ID, "aggregate"),
                                                         (DAG_ID, "publish"), (LEADERS, "leaders")) for e in (5, 6)}
    assert across.plan(DAG_ID).task("aggregate").restore_from.epoch == 4
    assert across.plan(DAG_ID).task("aggregate").restore_from.tier == "durable"
    assert across.plan(LEADERS).task("leaders").restore_from.epoch == 4
    replay_across([p.plan_id for p in across.plans], store, client, holder="admin", timeout=900)
    rows = Ledger(store).entries(LEADERS, "leaders")
    publish = {r.epoch: r.incarnation for r in Ledger(store).entries(DAG_ID, "publish")}
    assert [(r.epoch, [(a.epoch, a.incarnation) for a in r.asset_inputs]) for r in rows] == [
        (e, [(e, publish[e])]) for e in EPOCHS]
    assert stale_reads(rows, Ledger(store).entries(DAG_ID, "publish")) == []
    # every table as in the failure-free run, but for the scratch epochs no recovery needed again
    # (ingest's and aggregate's outputs 1-4, aggregate's scratch state 1-4: gone with the disk)
    now, lost = _tables(store), {f"{n} ({Tier.SCRATCH.value})" for _, n, t in TABLES if t == Tier.SCRATCH}
    assert {k: v for k, v in now.items() if k not in lost} == {k: v for k, v in reference.items() if k not in lost}
    assert {k: now[k] for k in lost} == {k: v for k, v in _tables(store, range(5, 7)).items() if k in lost}
    assert {k: [r for r in reference[k] if dict(r)["epoch"] in (5, 6)] for k in lost} == {k: now[k] for k in lost}


def _control_counts(epochs: list[tuple[int, bool]]) -> dict[str, int]:
    """leaders' state after the control's runs over ``epochs`` ((epoch, bad input?), in run order)."""
    from falkirk.spark_jobs.pipeline.source import orders_for_epoch

    counts: dict[str, int] = {}
    for e, bad in epochs:
        totals: dict[str, int] = {}
        for o in orders_for_epoch(e):
            amount = 1000 if bad and o["customer"] == "bob" else o["amount"]
            if amount > 0:
                totals[o["customer"]] = totals.get(o["customer"], 0) + amount
        for c in sorted(totals, key=lambda c: (-totals[c], c))[:3]:
            counts[c] = counts.get(c, 0) + 1
    return counts


def test_airflow_alone_re_triggers_only_the_consumers_epoch_and_leaves_it_stale(joined) -> None:
    """The control: the same bad input in producer epoch 3, recovered the way Airflow alone
    can (correct the input, clear the producer's task instance): the redo's asset event starts
    the consumer's epoch 3 again, which adds it to a state that already holds epochs 1-6, and
    the consumer's epochs 4-6 stay built on the bad ranking."""
    import json

    stack, store, client, _ = joined
    plain = Path(stack.home).parent / "plain"
    (plain / "bad").mkdir(parents=True)
    (plain / "bad" / "3").touch()
    client.wait_for_dag("plain_leaders")
    client.set_paused("plain_leaders", False)
    assert run_epochs(client, dag_epoch_clock(), EPOCHS, dag_id="plain_orders", progress=print) == {
        e: "success" for e in EPOCHS}
    before = _plain_runs(client, len(EPOCHS))
    (plain / "bad" / "3").unlink()  # the input is corrected ...
    client.clear("plain_orders", run_id_of(3), ["publish"])  # ... and the producer's epoch 3 run again
    assert client.wait_for_run("plain_orders", run_id_of(3)) == "success"
    again = _plain_runs(client, len(EPOCHS) + 1)[-1]
    assert again["partition_key"] == before[2]["partition_key"]
    assert client.wait_for_run("plain_leaders", again["dag_run_id"]) == "success"  # green, and stale:

    def state(name: str) -> dict[str, int]:
        return json.loads((plain / "leaders" / f"{name}.json").read_text())
    bad = [(e, e == 3) for e in EPOCHS]
    failure_free = _control_counts([(e, False) for e in EPOCHS])
    # epoch 3 counted twice (bad, then corrected), on top of epochs 4-6 computed after the bad one
    assert state("state") == _control_counts([*bad, (3, False)]) != failure_free
    for e in (4, 5, 6):  # never re-run: built on the bad ranking
        assert state(str(e)) == _control_counts(bad[:e]) != _control_counts([(k, False) for k in range(1, e + 1)])


def _plain_runs(client, count: int) -> list[dict]:
    from devstack.processes import wait_until

    found: list[dict] = []

    def enough() -> bool:
        found[:] = client.request("GET", "/api/v2/dags/plain_leaders/dagRuns",
                                  params={"order_by": "run_after", "limit": 100})["dag_runs"]
        return len(found) >= count and all(r["state"] in ("success", "failed") for r in found)

    wait_until(f"{count} finished runs of plain_leaders", enough, timeout=300)
    return list(found)


def _lineage(stack: AirflowStack, job: str, epoch: int) -> list[dict]:
    """The OpenLineage run events of ``job``'s task instances that ran ``epoch``, as emitted."""
    lines = (Path(stack.home).parent / LINEAGE_FILE).read_text().splitlines()
    events = [json.loads(line) for line in lines if line.strip()]
    return [e for e in events if e["job"] == {"namespace": LINEAGE_NAMESPACE, "name": job, **{
        k: v for k, v in e["job"].items() if k not in ("namespace", "name")}}
            and e["run"]["facets"].get("falkirk", {}).get("epoch") == epoch]


def _datasets(datasets: list[dict]) -> list[tuple]:
    return sorted((d["namespace"], d["name"], d["facets"]["version"]["datasetVersion"],
                   d.get("outputFacets", {}).get("outputStatistics", {}).get("rowCount")) for d in datasets)


def test_lineage_shows_each_epoch_read_and_written_and_a_redo_as_a_new_run_of_the_same_job(joined) -> None:
    from falkirk.policies.lineage import dataset_name

    stack, store, client, reference = joined
    rows = {(r.task_id, r.epoch): r for dag in (DAG_ID, LEADERS) for r in Ledger(store).entries(dag)}
    # every commit is an OpenLineage run of its task's job: its epoch and incarnation, and the
    # Delta version and rows of each table it wrote
    for (task, epoch), row in rows.items():
        job = f"{row.dag_id}.{task}"
        done = [e for e in _lineage(stack, job, epoch) if e["eventType"] == "COMPLETE"
                and e["run"]["facets"]["falkirk"]["incarnation"] == row.incarnation]
        assert done, f"no COMPLETE event of {job} epoch {epoch} incarnation {row.incarnation}"
        assert {tuple(_datasets(e["outputs"])) for e in done} == {tuple(sorted(
            (*dataset_name(o.uri), str(o.version), o.rows) for o in row.outputs))}, (job, epoch)
        assert all(e["run"]["facets"]["falkirk"]["regime"] == row.regime for e in done)
    # publish's epoch 6 is redone, and leaders' epoch 6 that read it: one plan across both DAGs
    publish, leaders = rows["publish", 6], rows["leaders", 6]
    across = plan_across(DAG_ID, store, client, bad_epochs=[("publish", 6)])
    assert across.rerun_set() == {(DAG_ID, "publish", 6), (LEADERS, "leaders", 6)}
    replay_across([p.plan_id for p in across.plans], store, client, holder="admin", timeout=900)
    redo = Ledger(store).entries(DAG_ID, "publish")[-1]
    reread = Ledger(store).entries(LEADERS, "leaders")[-1]
    assert (redo.epoch, redo.incarnation, reread.epoch, reread.incarnation) == (
        6, publish.incarnation + 1, 6, leaders.incarnation + 1)
    # The redo is a new run of the same job, with the next incarnation, replacing the one before
    runs = {e["run"]["facets"]["falkirk"]["incarnation"]: e for e in _lineage(stack, f"{DAG_ID}.publish", 6)
            if e["eventType"] == "COMPLETE"}
    before, after = runs[publish.incarnation], runs[redo.incarnation]
    assert before["run"]["runId"] != after["run"]["runId"]
    assert (after["run"]["facets"]["falkirk"]["replacement"], after["run"]["facets"]["falkirk"]["committed"]) == (
        True, True)
    assert _datasets(after["outputs"]) == [(*dataset_name(o.uri), str(o.version), o.rows) for o in redo.outputs]
    # ... which read aggregate's epoch 6 at the version that commit wrote
    aggregate = rows["aggregate", 6].outputs[0]
    assert _datasets(after["inputs"]) == [(*dataset_name(aggregate.uri), str(aggregate.version), None)]
    # leaders' redo read publish's redo through the Asset: its input is the version the redo wrote
    reads = [e for e in _lineage(stack, f"{LEADERS}.leaders", 6) if e["eventType"] == "COMPLETE"
             and e["run"]["facets"]["falkirk"]["incarnation"] == reread.incarnation and e["inputs"]]
    assert [_datasets(e["inputs"]) for e in reads] == [
        [(*dataset_name(o.uri), str(o.version), None) for o in redo.outputs]]
    # publish is deterministic: both redone tables hold what the failure-free run committed
    durable = [f"{name} ({Tier.DURABLE.value})" for name in ("publish/output", "leaders/state", "leaders/output")]
    assert {k: _tables(store)[k] for k in durable} == {k: reference[k] for k in durable}


def test_a_producer_killed_after_its_commit_is_marked_success_and_its_event_emitted_for_the_consumer(joined) -> None:
    """publish's epoch 7 commits and records its epoch completed, and its process is SIGKILLed
    before Airflow hears of it: Airflow shows it failed (retries=0) and emits no asset event, so
    falkirk_orders_leaders gets no run of epoch 7. The plan for the failed instance redoes it,
    and that redo is killed the same way. Its replay finds the redo committed and completed,
    emits the event neither attempt did (the redo's commit record, the epoch's partition key)
    and marks publish success. leaders then runs epoch 7, once, reading the redo."""
    from devstack.processes import wait_until

    stack, store, client, _ = joined
    faults = Path(stack.home).parent / "faults"
    key = epoch_partition_key(dag_epoch_clock().logical_date(7))
    crash = f"{DAG_ID}/publish:7:after-completion:once\n"

    def runs_of_7() -> list[dict]:
        return [r for r in _leaders_runs(stack, 1) if r["partition_key"] == key]

    faults.write_text(crash)
    said: list[str] = []
    try:
        assert run_epochs(client, dag_epoch_clock(), [7], progress=print) == {7: "failed"}
        assert [e.incarnation for e in Ledger(store).entries(DAG_ID, "publish") if e.epoch == 7] == [0]
        assert runs_of_7() == []  # no event, no run
        p = plan(DAG_ID, store, client, failed_tasks=["publish"])
        assert p.rerun_set() == {("publish", 7)}
        faults.write_text(crash)
        replay(p.plan_id, store, client, progress=lambda m: (said.append(m), print(m)), timeout=600)
    finally:
        faults.write_text("")
    [redo] = [e for e in Ledger(store).entries(DAG_ID, "publish") if e.epoch == 7]
    assert redo.incarnation == 1
    assert f"plan {p.plan_id}: emitted the asset events of publish epoch 7 (incarnation 1) that its failed " \
           f"attempt did not: {ASSET}" in said, said
    assert f"plan {p.plan_id}: publish of epoch 7 failed after the redo had committed (an attempt killed after " \
           f"its commit, run again): marked success" in said, said
    assert client.task_instances(DAG_ID, run_id_of(7))["publish"]["state"] == "success"

    wait_until("leaders' run of epoch 7", lambda: len(runs_of_7()) == 1, timeout=300)
    [run] = runs_of_7()
    assert client.wait_for_run(LEADERS, run["dag_run_id"], timeout=600) == "success"
    [row] = [e for e in Ledger(store).entries(LEADERS, "leaders") if e.epoch == 7]
    assert (row.run_id, row.asset_inputs) == (run["dag_run_id"],
                                              (AssetInput(asset=ASSET, dag_id=DAG_ID, task_id="publish", output="output", epoch=7, incarnation=1),))
    assert _state(store, 7) == _oracle(table_rows(store, "publish/output"), list(range(1, 8)))
    # emitted once: a replay resumed after emitting them (or a refused re-run of an epoch whose
    # first attempt succeeded) finds the commit's event and emits none again
    assert emit_missing_events(client, redo) == []
    assert len(runs_of_7()) == 1


def test_a_consumer_run_that_failed_before_its_first_commit_is_replayed_in_the_run_of_its_partition(joined) -> None:
    """leaders' run of epoch 8 is SIGKILLed before its commit (retries=0): Airflow started the
    run on publish's event, so it has no logical date, and no ledger row names it. The plan for
    the failed instance re-runs leaders 8; its replay finds that run by its partition (the
    epoch's date) and runs it again there: one run of epoch 8, its state equal to the oracle."""
    from devstack.processes import wait_until

    stack, store, client, _ = joined
    faults = Path(stack.home).parent / "faults"
    key = epoch_partition_key(dag_epoch_clock().logical_date(8))

    def runs_of_8() -> list[dict]:
        return [r for r in _leaders_runs(stack, 1) if r["partition_key"] == key]

    faults.write_text(f"{LEADERS}/leaders:8:before-commit:once\n")
    try:
        assert run_epochs(client, dag_epoch_clock(), [8], progress=print) == {8: "success"}
        wait_until("leaders' run of epoch 8", lambda: len(runs_of_8()) == 1, timeout=300)
        [run] = runs_of_8()
        assert client.wait_for_run(LEADERS, run["dag_run_id"], timeout=600) == "failed"
    finally:
        faults.write_text("")
    assert (run["logical_date"], [e.epoch for e in Ledger(store).entries(LEADERS) if e.epoch == 8]) == (None, [])

    p = plan(LEADERS, store, client, failed_instances=[("leaders", 8)])
    assert p.rerun_set() == {("leaders", 8)}
    # The API server places the run by its partition too: its plan covers epoch 8, as the CLI's.
    preview = client.request("POST", f"/falkirk/api/v1/dags/{LEADERS}/preview",
                             json={"failed_tasks": [{"task_id": "leaders", "epoch": 8}]})
    assert (preview["last_epoch"], [tuple(k) for k in preview["rerun"]]) == (p.last_epoch, [("leaders", 8)])
    replay(p.plan_id, store, client, progress=print, timeout=600)
    assert client.task_instances(LEADERS, run["dag_run_id"])["leaders"]["state"] == "success"
    [row] = [e for e in Ledger(store).entries(LEADERS, "leaders") if e.epoch == 8]
    assert row.run_id == run["dag_run_id"]
    assert [r["dag_run_id"] for r in runs_of_8()] == [run["dag_run_id"]]
    assert _state(store, 8) == _oracle(table_rows(store, "publish/output"), list(range(1, 9)))


# -- the edges: a paused consumer, ids that traverse paths, a discard under a consumer ----------

def _runs_at(stack: AirflowStack, epoch: int) -> list[dict]:
    """leaders' runs of ``epoch`` (its partition key), oldest first."""
    key = epoch_partition_key(dag_epoch_clock().logical_date(epoch))
    return [r for r in _leaders_runs(stack, 1) if r["partition_key"] == key]


def _every_run_green_and_every_row_run(store: StoreConfig, client) -> None:
    """Every run of both DAGs succeeded, and every current ledger row names a run Airflow has."""
    for dag in (DAG_ID, LEADERS):
        runs = client.request("GET", f"/api/v2/dags/{dag}/dagRuns", params={"limit": 1000})["dag_runs"]
        assert {r["dag_run_id"]: r["state"] for r in runs} == {r["dag_run_id"]: "success" for r in runs}, dag
        rows = Ledger(store).entries(dag)
        assert {e.run_id for e in rows} <= {r["dag_run_id"] for r in runs}, dag


def _as_in_the_failure_free_run(store: StoreConfig, reference: dict[str, list[tuple]]) -> None:
    """Every table of both DAGs as in the failure-free run (epochs 1-6), the scratch tables as far
    as they are left after the lost scratch tier (epochs 5 and 6, which its recovery redid)."""
    now, kept = _tables(store), _tables(store, range(5, 7))
    for name, rows in reference.items():
        if "(scratch)" in name:
            assert kept[name] == [r for r in rows if dict(r)["epoch"] in (5, 6)], name
        else:
            assert now[name] == rows, name


def _leaders_follow_the_ranking(store: StoreConfig, epochs: range) -> None:
    """leaders' state of each epoch is the Python oracle's over publish's current rows."""
    ranking = table_rows(store, "publish/output")
    for e in epochs:
        assert _state(store, e) == _oracle(ranking, list(range(1, e + 1))), f"leaders' state of epoch {e}"
        assert _state(store, e, "output") == _state(store, e), f"leaders' output of epoch {e}"


def test_a_consumer_paused_while_its_producer_publishes_is_recovered_by_the_plan_its_refusal_names(joined) -> None:
    """leaders is paused while falkirk_orders publishes epoch 9: Airflow starts no run of it, then
    or after leaders is unpaused. Epoch 10's run is refused ("the previous epoch 9 has no
    checkpoint"), naming a plan; that plan's replay emits epoch 9's event again, so Airflow
    starts leaders' run of 9, then runs 10 again: one run of each, green, leaders' state equal to
    the oracle's."""
    from devstack.processes import wait_until

    stack, store, client, reference = joined
    client.set_paused(LEADERS, True)
    try:
        assert run_epochs(client, dag_epoch_clock(), [9], progress=print) == {9: "success"}
        time.sleep(5)  # the scheduler would have queued leaders' run by now
    finally:
        client.set_paused(LEADERS, False)
    assert _runs_at(stack, 9) == []
    assert run_epochs(client, dag_epoch_clock(), [10], progress=print) == {10: "success"}
    wait_until("leaders' run of epoch 10", lambda: len(_runs_at(stack, 10)) == 1, timeout=300)
    [ten] = _runs_at(stack, 10)
    assert client.wait_for_run(LEADERS, ten["dag_run_id"], timeout=600) == "failed"
    log = client.task_log(LEADERS, ten["dag_run_id"], "leaders", 1)
    assert "leaders epoch 10: the previous epoch 9 has no checkpoint" in log, log[-2000:]
    advice = f"falkirk plan --dag {LEADERS} --failed-task leaders:9"
    assert advice in log, log[-2000:]

    # the plan the refusal names, as the CLI makes it from those words
    p = plan(LEADERS, store, client, failed_instances=[("leaders", 9)])
    assert p.rerun_set() == {("leaders", 9), ("leaders", 10)}
    said: list[str] = []
    replay(p.plan_id, store, client, progress=lambda m: (said.append(m), print(m)), timeout=900)
    assert any(f"{LEADERS} has no run of epoch 9" in m and ASSET in m for m in said), said
    [nine] = _runs_at(stack, 9)
    assert [r["dag_run_id"] for r in _runs_at(stack, 10)] == [ten["dag_run_id"]]
    assert client.wait_for_run(LEADERS, nine["dag_run_id"], timeout=60) == "success"
    assert client.dag_run(LEADERS, ten["dag_run_id"])["state"] == "success"
    rows = {e.epoch: e for e in Ledger(store).entries(LEADERS, "leaders")}
    publish = {e.epoch: e.incarnation for e in Ledger(store).entries(DAG_ID, "publish")}
    assert [(rows[e].run_id, rows[e].asset_inputs) for e in (9, 10)] == [
        (run["dag_run_id"], (AssetInput(asset=ASSET, dag_id=DAG_ID, task_id="publish", output="output", epoch=e, incarnation=publish[e]),))
        for e, run in ((9, nine), (10, ten))]
    _leaders_follow_the_ranking(store, range(1, 11))
    _as_in_the_failure_free_run(store, reference)
    _every_run_green_and_every_row_run(store, client)


@pytest.mark.parametrize("dag", [f"x/../{DAG_ID}", f"./{DAG_ID}", f"{LEADERS}/../{DAG_ID}", f"{DAG_ID}/.", "..",
                                 f"{DAG_ID}?x=1", "orders and more"])
def test_a_dag_id_that_traverses_a_path_is_refused_before_anything_is_read_or_written(
        joined, dag, monkeypatch, capsys) -> None:
    """A DAG id Airflow would refuse (a path through another DAG's, a query, a space) is refused
    by every command and route with the rule it breaks; nothing is read or written: falkirk_orders'
    run of epoch 10 and its ledger rows stay as they are."""
    from falkirk.plugins.cli import main

    stack, store, client, reference = joined
    for k, v in {**store.env(), "FALKIRK_AIRFLOW_URL": stack.base_url, "FALKIRK_AIRFLOW_USER": "admin",
                 "FALKIRK_AIRFLOW_PASSWORD": "admin"}.items():
        monkeypatch.setenv(k, v)
    before = Ledger(store).dag_version(DAG_ID), Ledger(store).entries(DAG_ID), client.dag_run(DAG_ID, run_id_of(10))
    for argv in (["discard", "--dag", dag, "--epochs", "10", "--yes"], ["plan", "--dag", dag, "--failed-task", "*"],
                 ["trigger", "--dag", dag], ["gc", "--dag", dag]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "argument --dag: " in err and "not an Airflow DAG id: use letters, digits, _, . and -" in err, err
    assert (Ledger(store).dag_version(DAG_ID), Ledger(store).entries(DAG_ID), client.dag_run(DAG_ID, run_id_of(10))
            ) == before
    # the library refuses it too, before any request; and a path built from it stays one segment
    from falkirk.plugins.airflow_rest import AirflowError, api_path
    from falkirk.plugins.discard import plan_discard
    from falkirk.policies.ids import IdError

    with pytest.raises(IdError, match="not an Airflow DAG id"):
        plan_discard(dag, store, client, 10, 10)
    assert client.http.get(api_path("dags", dag)).status_code == 404
    if "/" in dag or "?" in dag or set(dag) == {"."}:  # a path put together by hand: refused, never sent
        with pytest.raises(AirflowError, match="a path segment is '.' or '..', or it holds '\\?' or '#'"):
            client.request("DELETE", f"/api/v2/dags/{dag}/dagRuns/{run_id_of(10)}")
    # the Falkirk API: 422 naming the path parameter (or no route at all, for an id with a slash)
    answer = client.http.get(api_path("dags", dag, "view", root="/falkirk/api/v1"))
    assert answer.status_code in (404, 422), answer.text
    if "/" not in dag:
        assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["path", "dag_id"], answer.text
    assert client.dag_run(DAG_ID, run_id_of(10)) == before[2]


def test_a_discard_of_a_producer_epoch_withdraws_the_consumer_epoch_that_read_it(joined, monkeypatch, capsys) -> None:
    """falkirk_orders' epoch 10 is discarded after leaders read it. Alone, the discard is refused,
    naming leaders' epoch and the --consumers form; with it, the preview names both DAGs' rows and
    runs (nothing changes), and the discard withdraws both. Epoch 10 then runs again: its event
    starts a new run of leaders' epoch 10, which runs (nothing refused), and every table of both
    DAGs is as before, every run green, no row without its run."""
    from falkirk.plugins.cli import main

    stack, store, client, reference = joined
    for k, v in {**store.env(), "FALKIRK_AIRFLOW_URL": stack.base_url, "FALKIRK_AIRFLOW_USER": "admin",
                 "FALKIRK_AIRFLOW_PASSWORD": "admin"}.items():
        monkeypatch.setenv(k, v)
    before = {e: _state(store, e) for e in range(1, 11)}
    ranking = [r for r in table_rows(store, "publish/output") if r["epoch"] == 10]
    versions = Ledger(store).dag_version(DAG_ID), Ledger(store).dag_version(LEADERS)
    [old] = _runs_at(stack, 10)

    assert main(["discard", "--dag", DAG_ID, "--epochs", "10", "--yes"]) == 2
    err = capsys.readouterr().err
    assert f"other DAGs read these epochs through an Asset ({LEADERS} epochs 10)" in err, err
    assert f"falkirk discard --dag {DAG_ID} --epochs 10-10 --consumers" in err, err
    assert main(["discard", "--dag", DAG_ID, "--epochs", "10", "--consumers"]) == 0
    out = capsys.readouterr().out
    assert "  publish: rolls back 1 ledger row (epochs 10)" in out and f"deletes 1 DAG run: {run_id_of(10)}" in out, out
    assert f"{LEADERS} read these epochs through an Asset:" in out and "  leaders: rolls back 1 ledger row (epochs " \
        "10)" in out and f"deletes 1 DAG run: {old['dag_run_id']}" in out, out
    assert out.count("the DAG's next epoch is then 10") == 2, out
    assert (Ledger(store).dag_version(DAG_ID), Ledger(store).dag_version(LEADERS)) == versions  # a preview
    assert main(["discard", "--dag", DAG_ID, "--epochs", "10", "--consumers", "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"discarded epochs 10..10 of {LEADERS}; its next epoch is 10" in out, out
    assert f"discarded epochs 10..10 of {DAG_ID}; its next epoch is 10" in out, out
    assert max(e.epoch for e in Ledger(store).entries(LEADERS)) == max(e.epoch for e in Ledger(store).entries(DAG_ID)) \
        == 9
    assert not client.run_exists(LEADERS, old["dag_run_id"]) and not client.run_exists(DAG_ID, run_id_of(10))
    _every_run_green_and_every_row_run(store, client)

    # epoch 10 again: a new run of leaders' epoch 10, on the new event, runs and reads the redo
    assert run_epochs(client, dag_epoch_clock(), [10], progress=print) == {10: "success"}
    from devstack.processes import wait_until

    wait_until("leaders' new run of epoch 10", lambda: len(_runs_at(stack, 10)) == 1, timeout=300)
    [new] = _runs_at(stack, 10)
    assert client.wait_for_run(LEADERS, new["dag_run_id"], timeout=600) == "success"
    [row] = [e for e in Ledger(store).entries(LEADERS, "leaders") if e.epoch == 10]
    [redo] = [e for e in Ledger(store).entries(DAG_ID, "publish") if e.epoch == 10]
    assert (row.run_id, row.asset_inputs) == (new["dag_run_id"], (
        AssetInput(asset=ASSET, dag_id=DAG_ID, task_id="publish", output="output", epoch=10, incarnation=redo.incarnation),))
    assert [r for r in table_rows(store, "publish/output") if r["epoch"] == 10] == ranking
    assert {e: _state(store, e) for e in range(1, 11)} == before
    _leaders_follow_the_ranking(store, range(1, 11))
    _as_in_the_failure_free_run(store, reference)
    _every_run_green_and_every_row_run(store, client)

    # Nothing failed is left: the refused second runs that recoveries settled (their runs green,
    # their refused instances kept failed) are no failures to plan.
    with pytest.raises(PlanError, match=f"Airflow reports no failed instance of 'leaders' in '{LEADERS}'"):
        plan(LEADERS, store, client, failed_tasks=["leaders"], record=False)
    assert main(["plan", "--dag", LEADERS, "--bad-epoch", "leaders:10", "--consumers"]) == 0
    assert f"re-runs 1 task instance in 1 DAG ({LEADERS})" in capsys.readouterr().out
    # the watch refuses a DAG Airflow does not have, before it pings
    monkeypatch.setenv("FALKIRK_WORKERS", "worker-a")
    assert main(["watch", "--dag", "no_such_dag"]) == 2
    assert "--dag no_such_dag: Airflow has no DAG 'no_such_dag'" in capsys.readouterr().err
