"""Partitioned tasks through Airflow: a failure re-runs only the partitions it touched.

``dags/falkirk_shards.py`` (events, 2 partitions -> repartitioned by user -> totals, 4
partitions, LazyCheckpoint(every=4) -> one-to-one -> leaders, 4 partitions -> report) runs
epochs 1-6 as ``shards_a`` under Airflow (LocalExecutor), its jobs clients of the session's
Spark Connect server; partition 2 of ``totals`` is killed at epoch 4 (SIGKILL before its
commit). ``shards_ref``, the failure-free reference, runs the same jobs with the same
command lines without Airflow, partition by partition (``python -m devstack.inprocess``).

The view of ``shards_a`` shows a grid row per partition and previews the failure's plan cell
for cell (headless Chromium). Then, on ``shards_a``, one recovery after another, each planned
and replayed as a user would, each ending with every table (per partition) equal to the reference's:

1. the failed partition: it re-runs epochs 4-6 from its own state of epoch 3, with what
   Airflow never ran after it; the other partitions of totals keep their epoch 4 (Airflow's
   ``depends_on_past`` held back their epochs 5 and 6, which run from their own state);
2. a bad epoch of one source partition (events[1] epoch 3): that partition's epoch, and
   every partition that read it (all of totals, through the repartitioning edge);
3. the scratch directories of two totals partitions deleted: those two partitions restore
   their durable state of epoch 4, and only the leaders partitions that read them re-run.

Last, garbage collection runs partition by partition on what the recoveries left.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from devstack.airflow import AirflowStack
from devstack.demo import dag_epoch_clock, run_id_of
from devstack.inprocess import run_reference_process
from devstack.spark import SparkConnectServer
from falkirk.policies.ids import ProcessorId
from falkirk.plugins.recovery import plan, replay
from falkirk.policies.partitions import processors
from falkirk.policies.regimes import Tier
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import open_table, scan
from falkirk.policies.store.ledger import Ledger
from tests.integration.recovery.drill import wait_states
from tests.integration.test_falkirk_view import browser, cells, login, open_view, shot  # noqa: F401 (browser: a fixture)
from tests.oracle import canonical

ROOT = Path(__file__).resolve().parents[2]


def _shards_dag():
    spec = importlib.util.spec_from_file_location("falkirk_shards_dag", ROOT / "dags" / "falkirk_shards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

REF, A = "shards_ref", "shards_a"
EPOCHS = list(range(1, 7))
SHARDS = _shards_dag().TASKS  # task: (regime, partitions)
PARTITIONS = {t: n for t, (_, n) in SHARDS.items()}
PROCESSORS = [p for task, n in PARTITIONS.items() for p in processors(task, n)]
# (task, table, tier): every table the pipeline writes, per partition
TABLES = [("events", "output", Tier.DURABLE), ("totals", "output", Tier.SCRATCH),
          ("totals", "state", Tier.SCRATCH), ("totals", "state", Tier.DURABLE), ("leaders", "output", Tier.DURABLE),
          ("report", "output", Tier.DURABLE)]
SUCCESS = {p: {"success"} for p in PROCESSORS}
DAG_FILE = '''"""Airflow DAG file: two copies of dags/falkirk_shards.py (a DAG factory), each with its own tables."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("falkirk_shards_dag", {path!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
shards_a = _module.build_dag("shards_a")
'''


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, spark_connect: SparkConnectServer):
    root = tmp_path_factory.mktemp("shards")
    store = StoreConfig(str(root / "durable"), str(root / "scratch"))
    dags = root / "dags"
    dags.mkdir()
    (dags / "shards.py").write_text(DAG_FILE.format(path=str(ROOT / "dags" / "falkirk_shards.py")))
    faults = root / "faults"
    faults.write_text(f"{A}/totals[2]:4:before-commit\n")
    stack = AirflowStack(home=root / "airflow", store=store, dags_folder=dags, extra_env={
        **spark_connect.airflow_env(), "FALKIRK_CRASH_AT": f"@{faults}"})
    stack.init()
    stack.start()
    try:
        client = stack.client()
        clock = dag_epoch_clock(ROOT / "dags" / "falkirk_shards.py")
        client.wait_for_dag(A)
        client.set_paused(A, False)
        for e in EPOCHS:
            client.trigger(A, run_id_of(e), clock.logical_date(e))
        reference_run(REF, store, spark_connect.url, len(EPOCHS))
        # depends_on_past waits for every partition of the previous run: all of totals waits
        blocked = {**{p: {"success"} for p in PROCESSORS if p.startswith("events")},
                   **{p: {None} for p in PROCESSORS if not p.startswith("events")}}
        wait_states(client, A, {**{e: SUCCESS for e in (1, 2, 3)}, 4: {
            **{p: {"success"} for p in PROCESSORS if p.startswith("events") or p in ("totals[0]", "totals[1]",
                                                                                     "totals[3]")},
            "totals[2]": {"failed"}, **{p: {"upstream_failed"} for p in PROCESSORS if p.startswith(("leaders",
                                                                                                    "report"))}},
            5: blocked, 6: blocked}, timeout=2400)
        faults.write_text("")  # the fault is fixed
        yield stack, store, client, root
    finally:
        stack.stop()


def reference_run(dag_id: str, store: StoreConfig, spark_remote: str, epochs: int) -> None:
    """The failure-free run of falkirk_shards's jobs under ``dag_id``, without Airflow."""
    run_reference_process(str(ROOT / "dags" / "falkirk_shards.py"), dag_id, "falkirk.spark_jobs.shards", epochs,
                          {**store.env(), "SPARK_REMOTE": spark_remote})


def table_rows(store: StoreConfig, dag: str, task: str, table: str, tier: Tier, map_index: int) -> list[tuple]:
    t = open_table(store.table_uri(tier, dag, task, table, map_index))
    return canonical(scan(t).to_pylist()) if t is not None else []


def assert_equals_reference(store: StoreConfig, lost: tuple[int, ...] = ()) -> None:
    """Every table of every partition of shards_a equals shards_ref's; the scratch tables of the
    ``lost`` totals partitions hold only the epochs written since, equal to the reference's."""
    for task, table, tier in TABLES:
        for p in range(PARTITIONS[task] or 1):
            index = p if PARTITIONS[task] else -1
            ref, got = (table_rows(store, dag, task, table, tier, index) for dag in (REF, A))
            if task == "totals" and p in lost and tier is Tier.SCRATCH:
                ref = [r for r in ref if dict(r)["epoch"] in {dict(g)["epoch"] for g in got}]
            assert ref and got == ref, f"{task}[{p}] {table} ({tier.value}) differs from the failure-free run"


def rerun(p) -> dict[str, list[int]]:
    return {t.task_id: list(t.rerun) for t in p.tasks if t.rerun}


def test_the_view_shows_each_partition_and_highlights_exactly_the_plans_cells(shards, browser) -> None:
    """The view's grid has a row per partition under its task (collapsible); the failed partition is
    preselected, and the preview highlights exactly the plan's (task, partition, epoch) cells."""
    stack, store, client, _ = shards
    vs = SimpleNamespace(stack=stack)
    context, page = login(browser, vs, "admin")
    try:
        open_view(page, vs, A)
        page.get_by_test_id("plan").wait_for(timeout=60_000)
        assert page.get_by_test_id("grid-task-totals").get_attribute("data-partitions") == "4"
        status = {p: "".join(page.get_by_test_id(f"cell-{p}-{e}").get_attribute("data-status") for e in EPOCHS)
                  for p in PROCESSORS}
        assert status == {**{f"events[{i}]": "LLLLLL" for i in range(2)},
                          **{f"totals[{i}]": "SSSD--" for i in (0, 1, 3)}, "totals[2]": "SSS---",
                          **{f"leaders[{i}]": "LLL---" for i in range(4)}, "report": "LLL---"}
        assert cells(page, "data-airflow-state", "failed") == {("totals[2]", 4)}
        assert page.get_by_test_id("failed-totals[2]-4").is_checked()
        preview = client.request("POST", f"/falkirk/api/v1/dags/{A}/preview",
                                 json={"failed_tasks": [{"task_id": "totals[2]", "epoch": 4}]})
        page.wait_for_function("id => document.querySelector('[data-testid=plan]').dataset.planId === id",
                               arg=preview["plan_id"], timeout=60_000)
        expected = {(t, e) for t, e in preview["rerun"]}
        assert ("totals[2]", 4) in expected and ("totals[0]", 4) not in expected and ("totals[0]", 5) in expected
        assert cells(page, "data-rerun", "true") == expected
        assert page.get_by_test_id("graph-badge-totals").text_content() == "4/4 partitions re-run"
        shot(page, "partitions-preview")
        # collapsed, totals is one row whose cells re-run if any partition's does
        page.get_by_test_id("toggle-totals").click()
        assert page.get_by_test_id("grid-row-totals[0]").count() == 0
        assert {e for t, e in cells(page, "data-rerun", "true") if t == "totals"} == {4, 5, 6}
        assert "1 of 4 partitions re-run" in page.get_by_test_id("cell-totals-4").get_attribute("title")
        shot(page, "partitions-collapsed")
    finally:
        context.close()


def test_a_failed_partition_reruns_alone_with_what_airflow_never_ran_after_it(shards) -> None:
    stack, store, client, _ = shards
    p = plan(A, store, client, failed_tasks=["totals"])
    print(p.table())
    assert [f.describe() for f in p.failures] == ["failed task totals[2] at epoch 4"]
    assert rerun(p) == {"totals[2]": [4, 5, 6], **{f"totals[{i}]": [5, 6] for i in (0, 1, 3)},
                        **{f"leaders[{i}]": [4, 5, 6] for i in range(4)}, "report": [4, 5, 6]}
    assert {t.task_id: t.kept_through for t in p.tasks if t.task_id.startswith("totals")} == {
        "totals[0]": 4, "totals[1]": 4, "totals[2]": 3, "totals[3]": 4}
    assert p.task("totals[2]").restore_from.epoch == 3 and p.task("totals[0]").restore_from.epoch == 4
    # Airflow's clear of the failed mapped instance with downstream and future: that partition,
    # and every partition of the tasks after it; the held-back epochs of the other partitions
    # would then run by themselves
    assert (len(p.rerun_set()), len(p.clear_downstream_set())) == (24, 18)
    replay(p.plan_id, store, client, progress=print)
    assert_equals_reference(store)
    # the partitions that did not fail committed each epoch once
    rows = Ledger(store).entries(A)
    assert {(r.processor, r.epoch, r.incarnation) for r in rows if r.processor == "totals[0]"} == {
        ("totals[0]", e, 0) for e in EPOCHS}


def test_a_bad_epoch_of_one_source_partition_reruns_what_read_it(shards) -> None:
    stack, store, client, _ = shards
    p = plan(A, store, client, bad_epochs=[("events[1]", 3)])
    print(p.table())
    assert rerun(p) == {"events[1]": [3], **{f"totals[{i}]": [3, 4, 5, 6] for i in range(4)},
                        **{f"leaders[{i}]": [3, 4, 5, 6] for i in range(4)}, "report": [3, 4, 5, 6]}
    assert p.task("totals[0]").restore_from.epoch == 2
    assert (len(p.rerun_set()), len(p.clear_downstream_set())) == (37, 40)
    replay(p.plan_id, store, client, progress=print)
    assert_equals_reference(store)
    assert {r.processor for r in Ledger(store).entries(A) if r.epoch == 4 and r.task_id == "events"} == {
        "events[0]", "events[1]"}


def totals_cells(page) -> dict[str, str]:
    return {f"totals[{i}]": "".join(page.get_by_test_id(f"cell-totals[{i}]-{e}").get_attribute("data-status")
                                    for e in EPOCHS) for i in range(4)}


def test_lost_scratch_of_two_partitions_reruns_those_partitions_and_their_readers(shards, browser) -> None:
    stack, store, client, root = shards
    lost = [store.table_uri(Tier.SCRATCH, A, "totals", "state", i).rsplit("/", 1)[0] for i in (0, 1)]
    for location in lost:
        shutil.rmtree(location)  # the two partitions' scratch directories are gone
    # The grid reads the scratch tables as the planner does: the two partitions' scratch-only
    # epochs are lost (X); epoch 4 keeps its durable state checkpoint (D).
    vs = SimpleNamespace(stack=stack)
    context, page = login(browser, vs, "admin")
    try:
        open_view(page, vs, A)
        assert totals_cells(page) == {"totals[0]": "XXXDXX", "totals[1]": "XXXDXX",
                                      "totals[2]": "SSSDSS", "totals[3]": "SSSDSS"}
        assert page.get_by_test_id("legend-status-X").inner_text() == "lost (scratch files gone)"
        shot(page, "partitions-lost-scratch")
        p = plan(A, store, client, lost_scratch=lost)
        print(p.table())
        assert rerun(p) == {"totals[0]": [5, 6], "totals[1]": [5, 6], "leaders[0]": [5, 6], "leaders[1]": [5, 6],
                            "report": [5, 6]}
        assert p.task("totals[0]").restore_from.epoch == 4 and p.task("totals[0]").restore_from.tier == "durable"
        # Airflow knows nothing of scratch: clearing both partitions from their first lost epoch
        assert (len(p.rerun_set()), len(p.clear_downstream_set())) == (10, 12 + 24 + 6)
        replay(p.plan_id, store, client, progress=print)
        assert_equals_reference(store, lost=(0, 1))
        # After the recovery: the re-run epochs are on scratch again; the earlier ones, which no
        # recovery needs, stay lost
        open_view(page, vs, A)
        assert totals_cells(page) == {"totals[0]": "XXXDSS", "totals[1]": "XXXDSS",
                                      "totals[2]": "SSSDSS", "totals[3]": "SSSDSS"}
        shot(page, "partitions-lost-scratch-after-recovery")
    finally:
        context.close()


def test_garbage_collection_works_partition_by_partition(shards) -> None:
    """After the recoveries: each partition has its own low-watermark, its own tables lose only
    the epochs below it, and a second collection finds nothing left."""
    from falkirk.policies.planning.collector import collect, live_partitions

    _, store, client, _ = shards
    report = collect(store, A, retain_hours=0)
    assert set(report.plan.watermarks) == set(PROCESSORS)
    assert report.plan.tables, "nothing was collected"
    for r in report.plan.tables:
        task, index = ProcessorId.parse(r.task_id).task, ProcessorId.parse(r.task_id).map_index
        assert r.uri.startswith(store.table_uri(Tier.DURABLE if "/durable/" in r.uri else Tier.SCRATCH, A, task,
                                                r.what, index)), (r.task_id, r.uri)
        assert not set(live_partitions(store, r.uri)) & set(r.epochs), f"{r.uri} still holds {r.epochs}"
    assert collect(store, A, retain_hours=0, dry_run=True).plan.tables == ()
    # and a recovery can still be planned from what is left
    p = plan(A, store, client, bad_epochs=[("totals[3]", 6)], record=False)
    assert rerun(p) == {"totals[3]": [6], "leaders[3]": [6], "report": [6]}


def test_a_lost_partitions_failure_names_the_partition_level_plan_and_its_size(shards, monkeypatch, capsys) -> None:
    """Last (it leaves epoch 7 failed): totals[1]'s scratch directory is deleted and epoch 7 runs,
    triggered with `falkirk trigger --wait`, which prints the end of the failed mapped instance's
    log. totals[1] fails with "state lost" and names the smallest plan that fixes it, the
    partition's own directory, with that plan's size; `falkirk plan` with those words re-runs
    exactly that many, fewer than the lost worker's plan would."""
    from falkirk.plugins.cli import main
    from falkirk.policies.workers import worker_name

    stack, store, client, _ = shards
    for k, v in {**store.env(), "FALKIRK_AIRFLOW_URL": stack.base_url, "FALKIRK_AIRFLOW_USER": "admin",
                 "FALKIRK_AIRFLOW_PASSWORD": "admin"}.items():
        monkeypatch.setenv(k, v)
    where = store.table_uri(Tier.SCRATCH, A, "totals", "state", 1).rsplit("/", 1)[0]
    shutil.rmtree(where)
    assert main(["trigger", "--dag", A, "--wait"]) == 1
    out = capsys.readouterr().out
    assert f"triggered {A} epoch 7: run manual__epoch-7" in out, out[-3000:]
    shown = out[out.index("--- totals[1] failed; the end of its log:"):]
    assert "its log could not be read" not in shown and f"--lost-scratch {where}" in shown, out[-3000:]
    states = {t: ti["state"] for t, ti in client.task_instances(A, "manual__epoch-7").items()}
    assert {t: states[t] for t in ("totals[1]", "leaders[1]", "report")} == {
        "totals[1]": "failed", "leaders[1]": "upstream_failed", "report": "upstream_failed"}, states
    log = "\n".join(p.read_text() for p in (stack.home / "logs").rglob("*.log")
                    if f"dag_id={A}" in str(p) and "run_id=manual__epoch-7" in str(p) and "task_id=totals" in str(p)
                    and "map_index=1" in str(p))
    found = re.search(rf"Recover with: falkirk plan --dag {A} --lost-scratch (\S+) \(re-runs (\d+) task instances "
                      rf"up to epoch 6, then epoch 7 on\)", log)
    assert found and found[1] == where, log[-3000:]
    p = plan(A, store, client, lost_scratch=[found[1]], record=False)
    print(p.table())
    # of epochs up to 6 the plan re-runs what the message counted: that partition, the leaders
    # partition reading it, and the report; epoch 7 then runs where it has not yet
    before = {(t, e) for t, e in p.rerun_set() if e < 7}
    assert len(before) == int(found[2]) == 6, p.table()
    assert before == {(t, e) for t in ("totals[1]", "leaders[1]", "report") for e in (5, 6)}
    assert ("totals[1]", 7) in p.rerun_set() and ("totals[0]", 7) not in p.rerun_set()
    lost_worker = plan(A, store, client, lost_workers=[worker_name()], record=False)
    assert len({(t, e) for t, e in lost_worker.rerun_set() if e < 7}) > 6
