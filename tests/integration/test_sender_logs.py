"""Sender-side logs through Airflow: a state with no checkpoint, rebuilt from retained blocks.

``dags/falkirk_regions.py`` runs under Airflow (LocalExecutor, one retry per task instance), its
jobs clients of the session's Spark Connect server, in two copies, each ending at epoch 6:

* ``regions_a``: ``join`` (a hash join, ``customers: at_end``) and ``total`` (running totals,
  ``join: at_end``) keep their state in scratch only. Garbage collection runs after every epoch.
  Before epoch 5, ``total``'s scratch directory is deleted, and its epoch-5 job is SIGKILLed
  part-way through rebuilding its state: Airflow retries it, and the retry rebuilds the state of
  epoch 4 by replaying ``join``'s retained epochs 1-4, with no checkpoint read
  (Smith & Watson, CS-TR-836 §IV.C; scenarios S2, S4). :data:`KILLS` lists the other faults (S1, S3, S6, S7, S9).
* ``regions_neg``: the same, but ``total`` declares ``join: immediate`` while keeping a state
  (``stateful=True``: a contract violation):
  garbage collection prunes ``join``'s epochs as soon as ``total`` commits them, the rebuild
  finds nothing to replay, and the totals from epoch 5 on miss epochs 1-4. The test detects it
  (S2's negative control).

* ``regions_vol``: every SenderLog task declares ``log_durability="volatile"`` (the paper's
  guarantees: a failed incarnation takes its state and its retained blocks with it), and tasks
  fail one after another (S5): ``total`` at epoch 4, then ``join`` at 5 (case 1: both recover,
  the report is right); then ``total`` at 6, whose rebuild needs ``join``'s blocks 1-4, lost
  with ``join``'s failed incarnation (case 2): the task is refused by name and epoch 6 is never
  reported, rather than reported wrong. ``regions_a`` is case 2 with durable logs: ``join``
  fails at 3 and ``total``'s rebuild at 5 replays ``join``'s blocks from before and after it.

Every table of ``regions_a`` equals ``regions_ref``'s (the same jobs, failure-free, without
Airflow: ``python -m devstack.inprocess``, for a longer execution: 20 epochs, garbage collected
after each), row for row; and what each edge retains after each epoch, in both, is exactly what
its reader has not released (S11): nothing on the edges read by stateless tasks, every epoch on
an ``at_end`` edge until the last, then nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from devstack.airflow import AirflowStack
from devstack.demo import dag_epoch_clock, run_id_of
from devstack.inprocess import retained_per_epoch, run_reference_process
from devstack.spark import SparkConnectServer
from falkirk.policies.epochs import epoch_ranges
from falkirk.policies.planning.collector import collect, live_partitions
from falkirk.policies.regimes import Tier
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import open_table, scan
from falkirk.policies.store.ledger import Ledger
from falkirk.spark_jobs.regions import customers_for_epoch
from tests.oracle import canonical

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DAG_PATH = ROOT / "dags" / "falkirk_regions.py"
COLOURS_PATH = ROOT / "dags" / "falkirk_colours.py"
PALETTE_PATH = ROOT / "dags" / "falkirk_palette.py"
A, NEG, VOL, REF = "regions_a", "regions_neg", "regions_vol", "regions_ref"
# regions_wipe: before epoch LOST_AT, total's scratch state loses its data files and keeps its _delta_log
# (a disk wiped in part): the table opens and its log counts the rows, but they cannot be read
WIPE = "regions_wipe"
COLOURS, COLOURS_REF = "colours_a", "colours_ref"
PALETTE, PALETTE_REF = "palette_a", "palette_ref"
DAGS = (A, NEG, VOL, COLOURS, PALETTE, WIPE)
END = 6
COLOURS_END = 7  # falkirk_colours: d3's last block
PALETTE_END = 4
REF_END = 20  # the reference execution's last epoch (S11's twenty)
LOST_AT = 5
TASKS = ["ingest", "customers", "clean", "join", "total", "report"]
EDGES = [("ingest", "clean"), ("customers", "join"), ("clean", "join"), ("join", "total"), ("total", "report")]
COLOURS_TASKS = ["d1", "d2", "d3", "join1", "join2", "result"]
COLOURS_EDGES = [("d1", "join1"), ("d2", "join1"), ("join1", "join2"), ("d3", "join2"), ("join2", "result")]
PALETTE_EDGES = [("palette", "tally"), ("palette", "shades"), ("tally", "merge"), ("shades", "merge")]
# Faults, per epoch, in regions_a (each task instance killed once, with SIGKILL, then retried by Airflow):
KILLS = {
    2: [("ingest", "after-files")],  # S7: the source dies before its commit; its retry regenerates the block
    3: [("clean", "before-commit"),  # S1: a stateless task in the middle
        ("join", "after-outputs"),  # S3: the hash join, its scratch lost, dies between its output and its row
        ("total", "before-commit")],  # S6: beside it, the aggregator after it in the chain, its scratch lost too
    4: [("report", "after-outputs")],  # S9: the sink wrote its epoch, then died before acknowledging it
    # S2 and S4: the aggregator, its scratch lost, dies part-way through rebuilding (after replaying
    # join's epoch 2 of 1-4); its retry rebuilds from the same retained epochs
    LOST_AT: [("total", "replayed-2")],
    # S5 case 1 with durable logs (total failed at 5, now join, its scratch lost: it rebuilds its
    # build side from customers); S7's variant: the source committed its block, then died before
    # its ledger row, and its retry's block is found already there
    6: [("join", "before-commit"), ("ingest", "after-outputs")],
}
LOST_SCRATCH = {3: ["join", "total"], LOST_AT: ["total"], 6: ["join"]}
# colours_a, S3(a): join2 (its log volatile: its retry starts without its state) killed while probing d3's block 1
KILLS_COLOURS = {7: [("join2", "before-commit")]}
# palette_a, S6: both middle tasks of the diamond (their logs volatile) killed in the same epoch
KILLS_PALETTE = {3: [("tally", "before-commit"), ("shades", "before-commit")]}
# regions_vol: nothing deleted by hand; a volatile task's retry starts without its state or its log
KILLS_VOL = {4: [("total", "before-commit")], 5: [("join", "before-commit")], 6: [("total", "before-commit")]}
DAG_FILE = '''"""Airflow DAG file: copies of dags/falkirk_regions.py (a DAG factory), each with tables of its own."""
import importlib.util

from falkirk.policies import SenderLog

_spec = importlib.util.spec_from_file_location("falkirk_regions_dag", {path!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
regions_a = _module.build_dag("regions_a", end={end})
regions_wipe = _module.build_dag("regions_wipe", end={end})
regions_neg = _module.build_dag("regions_neg", end={end}, overrides={{"total": SenderLog(release={{"join": "immediate"}}, stateful=True)}})
_cspec = importlib.util.spec_from_file_location("falkirk_colours_dag", {colours!r})
_colours = importlib.util.module_from_spec(_cspec)
_cspec.loader.exec_module(_colours)
colours_a = _colours.build_dag("colours_a", overrides={{
    "join2": SenderLog(release={{"join1": "at_end", "d3": "immediate"}}, end=7, log_durability="volatile")}})
_pspec = importlib.util.spec_from_file_location("falkirk_palette_dag", {palette!r})
_palette = importlib.util.module_from_spec(_pspec)
_pspec.loader.exec_module(_palette)
palette_a = _palette.build_dag("palette_a", overrides={{
    t: SenderLog(release=r.release, end=r.end, log_durability="volatile")
    for t, r in _palette.regimes().items() if t in ("tally", "shades")}})
regions_vol = _module.build_dag("regions_vol", end={end}, overrides={{
    t: SenderLog(release=r.release, end=r.end, log_durability="volatile")
    for t, r in _module.regimes({end}).items() if isinstance(r, SenderLog)}})
'''


def dag_module():
    spec = importlib.util.spec_from_file_location("falkirk_regions_dag", DAG_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def retained(store: StoreConfig, dag_id: str) -> dict[tuple[str, str], list[int]]:
    """Per edge, the epochs of the producer's output still stored (an epoch with no rows holds nothing)."""
    return {(u, v): sorted(live_partitions(store, store.table_uri(Tier.DURABLE, dag_id, u, "output")))
            for u, v in {COLOURS: COLOURS_EDGES, PALETTE: PALETTE_EDGES}.get(dag_id, EDGES)}


@pytest.fixture(scope="module")
def regions(tmp_path_factory: pytest.TempPathFactory, spark_connect: SparkConnectServer):
    root = tmp_path_factory.mktemp("regions")
    store = StoreConfig(str(root / "durable"), str(root / "scratch"))
    dags = root / "dags"
    dags.mkdir()
    (dags / "regions.py").write_text(DAG_FILE.format(path=str(DAG_PATH), colours=str(COLOURS_PATH),
                                                          palette=str(PALETTE_PATH), end=END))
    faults = root / "faults"
    faults.write_text("")
    stack = AirflowStack(home=root / "airflow", store=store, dags_folder=dags, parallelism=6, extra_env={
        **spark_connect.airflow_env(), "FALKIRK_CRASH_AT": f"@{faults}"})
    stack.init()
    stack.start()
    background = ThreadPoolExecutor(max_workers=1)
    try:
        env = {**store.env(), "SPARK_REMOTE": spark_connect.url}
        reference = background.submit(run_reference_process, str(DAG_PATH), REF, "falkirk.spark_jobs.regions",
                                      REF_END, env, regimes=dag_module().regimes(REF_END), collect=True)
        colours_reference = background.submit(run_reference_process, str(COLOURS_PATH), COLOURS_REF,
                                              "falkirk.spark_jobs.colours", COLOURS_END, env)
        palette_reference = background.submit(run_reference_process, str(PALETTE_PATH), PALETTE_REF,
                                              "falkirk.spark_jobs.colours", PALETTE_END, env)
        client = stack.client()
        clock = dag_epoch_clock(DAG_PATH)
        for dag_id in DAGS:
            client.wait_for_dag(dag_id)
            client.set_paused(dag_id, False)
        states: dict[tuple[str, int], str] = {}
        retention: dict[str, dict[int, dict]] = {d: {} for d in DAGS}
        ends = {A: END, NEG: END, VOL: END, COLOURS: COLOURS_END, PALETTE: PALETTE_END, WIPE: END}
        for epoch in range(1, max(ends.values()) + 1):
            running = [d for d in DAGS if epoch <= ends[d]]
            for task in LOST_SCRATCH.get(epoch, ()):  # the scratch tier's copy of the task's state is lost
                for dag_id in (A, NEG):
                    shutil.rmtree(Path(store.scratch_uri) / dag_id / task)
            if epoch == LOST_AT:
                wiped = Path(store.table_uri(Tier.SCRATCH, WIPE, "total", "state"))
                for data in [f for f in wiped.rglob("*") if f.is_file() and "_delta_log" not in f.parts]:
                    data.unlink()
            faults.write_text("".join(f"{d}/{task}:{epoch}:{point}:once\n" for d, kills in (
                (A, KILLS), (VOL, KILLS_VOL), (COLOURS, KILLS_COLOURS), (PALETTE, KILLS_PALETTE)) for task, point in kills.get(epoch, ())))
            for dag_id in running:
                client.trigger(dag_id, run_id_of(epoch), clock.logical_date(epoch))
            for dag_id in running:
                states[dag_id, epoch] = client.wait_for_run(dag_id, run_id_of(epoch), timeout=1200)
                collect(store, dag_id, retain_hours=0)
                retention[dag_id][epoch] = retained(store, dag_id)
        tis = {(d, e): client.task_instances(d, run_id_of(e)) for d in DAGS for e in range(1, ends[d] + 1)}
        logs = {(d, t, e, n): client.task_log(d, run_id_of(e), t, n) for (d, e), ti in tis.items() for t in ti
                for n in range(1, ti[t]["try_number"] + 1) if ti[t]["try_number"] > 1 or (d in (A, NEG, VOL, WIPE) and e in (LOST_AT, END))}
        retention[REF] = {e: {(u, v): held[u] for u, v in EDGES}
                          for e, held in retained_per_epoch(reference.result(timeout=1800)).items()}
        colours_reference.result(timeout=1800)
        palette_reference.result(timeout=1800)
        yield SimpleNamespace(store=store, states=states, tis=tis, logs=logs, retention=retention, env=env,
                              faults_left=faults.read_text())
    finally:
        background.shutdown(wait=True)
        stack.stop()


def table(store: StoreConfig, dag_id: str, task: str) -> list[tuple]:
    return canonical(scan(open_table(store.table_uri(Tier.DURABLE, dag_id, task, "output"))).to_pylist())


def test_only_the_failed_task_instance_re_ran_and_nothing_else_re_executed(regions) -> None:
    assert {k: s for k, s in regions.states.items() if k[0] in (A, NEG)} == {(d, e): "success" for d in (A, NEG)
                                                                          for e in range(1, END + 1)}
    tries = {(d, e, t): ti["try_number"] for (d, e), tis in regions.tis.items() for t, ti in tis.items() if d in (A, NEG)}
    killed = {(A, e, t): 2 for e, kills in KILLS.items() for t, _ in kills}
    assert {k: n for k, n in tries.items() if n != 1} == killed
    assert regions.faults_left.strip() == ""  # the last kill fired once
    for (_, e, t) in killed:
        point = dict(KILLS[e])[t]
        assert f"injected crash: {t} epoch {e} at {point}" in regions.logs[A, t, e, 1]
    rows = Ledger(regions.store).entries(A)
    assert sorted((r.task_id, r.epoch) for r in rows) == sorted((t, e) for t in TASKS for e in range(1, END + 1))
    assert {(r.task_id, r.epoch): r.try_number for r in rows if r.try_number != 1} == {
        (t, e): 2 for (_, e, t) in killed}
    assert {r.incarnation for r in rows} == {0}


def test_the_retry_rebuilt_the_state_from_the_retained_blocks_with_no_checkpoint_read(regions) -> None:
    first, retry = regions.logs[A, "total", LOST_AT, 1], regions.logs[A, "total", LOST_AT, 2]
    for log in (first, retry):
        assert (f"rebuilding the state of epoch {LOST_AT - 1} with no checkpoint, by replaying the blocks its "
                f"producers retain: join 1-{LOST_AT - 1}") in log, log[-3000:]
    assert "state rebuilt" not in first  # killed during the rebuild (S4)
    assert f"state rebuilt from {LOST_AT - 1} blocks (" in retry
    # join's scratch state was not touched: restored from it, nothing replayed
    join = regions.logs[A, "join", LOST_AT, 1]
    assert f"join epoch {LOST_AT}: restoring the state of epoch {LOST_AT - 1} from scratch" in join
    assert "rebuilding" not in join


def test_the_hash_join_rebuilt_its_build_side_and_replayed_no_probe_block(regions) -> None:
    """S3: join's scratch was lost before epoch 3 and its job killed after its output commit. Its
    retry replays every customers epoch (the build side, at_end) and no clean epoch (the probe
    side, released at once); its output commit of epoch 3 is found already made."""
    retry = regions.logs[A, "join", 3, 2]
    assert ("rebuilding the state of epoch 2 with no checkpoint, by replaying the blocks its producers retain: "
            "clean none; customers 1-2") in retry, retry[-3000:]
    assert "rows, already there)" in retry


def test_two_tasks_of_the_chain_rebuilt_their_states_in_the_same_epoch(regions) -> None:
    """S6 (a chain with two failures at once): join and total both lost their scratch before
    epoch 3 and both were killed in it; each retry replayed its own producers' retained epochs."""
    retry = regions.logs[A, "total", 3, 2]
    assert ("rebuilding the state of epoch 2 with no checkpoint, by replaying the blocks its producers retain: "
            "join 1-2") in retry, retry[-3000:]


def test_a_sink_killed_before_its_acknowledgement_rewrites_nothing(regions) -> None:
    """S9: report committed epoch 4 to its table and died before its ledger row, which is its
    acknowledgement (garbage collection prunes by ledger rows only, never before them). Its
    retry's write found the epoch already there; the sink holds each row once (the tables' test)."""
    retry = regions.logs[A, "report", 4, 2]
    assert "rows, already there)" in retry, retry[-3000:]


def test_a_source_killed_before_its_commit_regenerates_the_same_block(regions) -> None:
    """S7: ingest died before committing epoch 2; only it re-ran (the first test), and the block
    its retry committed is the failure-free run's (the tables' test). In epoch 6 it died after
    committing its block, before its ledger row: its retry's block was found already there."""
    assert "ingest epoch 2: committed" not in regions.logs[A, "ingest", 2, 1]
    retry = regions.logs[A, "ingest", 6, 2]
    assert "rows, already there)" in retry, retry[-3000:]


def test_a_task_failing_after_the_one_it_feeds_rebuilds_from_its_own_producers(regions) -> None:
    """S5 case 1, durable logs: total failed in epoch 5, then join in 6 with its scratch lost;
    join's retry rebuilt its build side from every customers block, and total went on from its
    scratch state (the report is the failure-free run's: the tables' test)."""
    retry = regions.logs[A, "join", 6, 2]
    assert ("rebuilding the state of epoch 5 with no checkpoint, by replaying the blocks its producers retain: "
            "clean none; customers 1-5") in retry, retry[-3000:]
    total = regions.logs[A, "total", 6, 1]
    assert "total epoch 6: restoring the state of epoch 5 from scratch" in total, total[-3000:]


def test_every_table_equals_the_failure_free_run_row_for_row(regions) -> None:
    store = regions.store
    # the sink is never collected: whole (the reference's runs on past the end); every other
    # table: the epochs it still holds
    assert table(store, A, "report") == [r for r in table(store, REF, "report") if dict(r)["epoch"] <= END] != []
    for task in TASKS[:-1]:
        held = set(live_partitions(store, store.table_uri(Tier.DURABLE, A, task, "output")))
        ref = [r for r in table(store, REF, task) if dict(r)["epoch"] in held]
        assert table(store, A, task) == ref, task
    totals = [dict(r) for r in table(store, A, "report") if dict(r)["epoch"] == END]
    print("report at epoch", END, sorted((r["rank"], r["region"], r["orders"], r["amount"]) for r in totals))


def test_a_state_whose_data_files_are_gone_and_log_kept_is_rebuilt_as_a_lost_one(regions) -> None:
    """regions_wipe: total's scratch state kept its _delta_log and lost its data files before
    epoch 5. Its job finds the files gone (not a raw Parquet error) and rebuilds the state of
    epoch 4 from join's retained blocks, as for a state that is gone: every run green at the first
    try, every table equal to the failure-free run's, every ledger row naming its run."""
    store = regions.store
    assert {e: regions.states[WIPE, e] for e in range(1, END + 1)} == {e: "success" for e in range(1, END + 1)}
    assert {(e, t): ti["try_number"] for (d, e), tis in regions.tis.items() if d == WIPE
            for t, ti in tis.items() if ti["try_number"] != 1} == {}
    log = regions.logs[WIPE, "total", LOST_AT, 1]
    assert "data files that are gone" in log and "Parquet error" not in log, log[-3000:]
    assert (f"rebuilding the state of epoch {LOST_AT - 1} with no checkpoint, by replaying the blocks its "
            f"producers retain: join 1-{LOST_AT - 1}") in log, log[-3000:]
    assert f"state rebuilt from {LOST_AT - 1} blocks (" in log, log[-3000:]
    assert table(store, WIPE, "report") == [r for r in table(store, REF, "report") if dict(r)["epoch"] <= END] != []
    for task in TASKS[:-1]:
        held = set(live_partitions(store, store.table_uri(Tier.DURABLE, WIPE, task, "output")))
        assert table(store, WIPE, task) == [r for r in table(store, REF, task) if dict(r)["epoch"] in held], task
    rows = Ledger(store).entries(WIPE)
    assert sorted((r.task_id, r.epoch, r.run_id) for r in rows) == sorted(
        (t, e, run_id_of(e)) for t in TASKS for e in range(1, END + 1))


@pytest.mark.parametrize("dag_id, end", [(A, END), (REF, REF_END)])
def test_retention_per_edge_is_what_the_readers_have_not_released(regions, dag_id: str, end: int) -> None:
    """S11: the edges read by stateless tasks (immediate) keep nothing once read; the at_end
    edges keep every epoch with rows until the last, then nothing. ``regions_a`` through its
    failures, six epochs; the reference, twenty."""
    with_rows = [e for e in range(1, end + 1) if customers_for_epoch(e)]
    retention = regions.retention[dag_id]
    assert sorted(retention) == list(range(1, end + 1))
    print(f"{dag_id}\n{'epoch':>5}  " + "  ".join(f"{u}->{v}" for u, v in EDGES))
    for epoch, edges in retention.items():
        print(f"{epoch:>5}  " + "  ".join(f"{epoch_ranges(edges[e]) or '-':>{len(e[0]) + len(e[1]) + 2}}"
                                          for e in EDGES))
    for epoch, edges in retention.items():
        final = epoch == end
        assert edges == {
            ("ingest", "clean"): [], ("clean", "join"): [], ("total", "report"): [],
            ("customers", "join"): [] if final else [e for e in with_rows if e <= epoch],
            ("join", "total"): [] if final else list(range(1, epoch + 1)),
        }, epoch


def test_a_release_declared_too_early_is_detected(regions) -> None:
    """regions_neg's total said ``join: immediate``: join's epochs were pruned as total committed
    them, the rebuild replayed none, and its totals from epoch 5 on count only epochs 5 on: the
    failure-free running totals of epoch 6 less those of epoch 4."""
    store = regions.store
    log = regions.logs[NEG, "total", LOST_AT, 1]
    assert "by replaying the blocks its producers retain: join none" in log, log[-3000:]
    assert all(edges[("join", "total")] == [] for edges in regions.retention[NEG].values())

    def amounts(dag_id: str, epoch: int) -> dict[str, int]:
        return {dict(r)["region"]: dict(r)["amount"] for r in table(store, dag_id, "report")
                if dict(r)["epoch"] == epoch}

    ref, before = amounts(REF, END), amounts(REF, LOST_AT - 1)
    since = {region: amount - before.get(region, 0) for region, amount in ref.items()}
    since = {region: amount for region, amount in since.items() if amount}
    assert amounts(NEG, END) == since != ref


def test_volatile_logs_recover_failures_in_order_and_refuse_a_lost_block_by_name(regions) -> None:
    """S5 with volatile logs: total fails at 4, then join at 5 (case 1): each retry starts without
    its state and rebuilds it, and join's retry drops the blocks it retained for total; the
    report of epochs 1-5 is the failure-free run's. Then total fails at 6 (case 2): its rebuild
    needs join's blocks 1-4, gone with join's failed incarnation, and is refused by name; epoch 6
    is never reported, rather than reported with a wrong total."""
    store = regions.store
    assert {e: regions.states[VOL, e] for e in range(1, END + 1)} == {**{e: "success" for e in range(1, END)},
                                                                       END: "failed"}
    tries = {(e, t): ti["try_number"] for (d, e), tis in regions.tis.items() if d == VOL for t, ti in tis.items()
             if ti["try_number"] != 1}
    assert tries == {(4, "total"): 2, (5, "join"): 2, (6, "total"): 2, (6, "report"): 0}, tries
    assert regions.tis[VOL, END]["report"]["state"] == "upstream_failed"
    total4 = regions.logs[VOL, "total", 4, 2]
    assert ("its state of epoch 3 was lost with the failed incarnation (log_durability=volatile); rebuilding the "
            "state of epoch 3 with no checkpoint, by replaying the blocks its producers retain: join 1-3") in total4, \
        total4[-3000:]
    join5 = regions.logs[VOL, "join", 5, 2]
    assert ("join epoch 5: attempt 2 follows a failed one; under log_durability=volatile the failed incarnation's "
            "state and the blocks it retained went with it: dropped 1-4 from its output tables") in join5, join5[-3000:]
    assert "by replaying the blocks its producers retain: clean none; customers 1-4" in join5
    total6 = regions.logs[VOL, "total", 6, 2]
    assert ("total epoch 5: unrecoverable: required blocks 1-4 of origin join missing (pruned, or lost with join's "
            "volatile log); not rebuilding its state without them") in total6, total6[-3000:]
    # what each edge retained: join's blocks for total grew to 1-4, then only what join wrote after its failure
    assert [regions.retention[VOL][e][("join", "total")] for e in range(1, END + 1)] == [
        [1], [1, 2], [1, 2, 3], [1, 2, 3, 4], [5], [5, 6]]
    report = table(store, VOL, "report")
    assert report == [r for r in table(store, REF, "report") if dict(r)["epoch"] < END] != []
    assert not [r for r in report if dict(r)["epoch"] == END]


def test_the_papers_three_way_join_re_reads_its_build_side_and_one_probe_block(regions) -> None:
    """S3(a), the P2 demonstration exactly: join2, killed while probing d3's block 1 (epoch 7,
    after result committed block 0's matches), starts again without its state. It re-reads all 7
    of join1's output rows (no block of its build side was released before the end) and of d3
    only block 1, the one it was probing; neither the scans nor join1 run again. The result is
    green x4, red and blue, each row once, as in the failure-free run."""
    store = regions.store
    assert {e: regions.states[COLOURS, e] for e in range(1, COLOURS_END + 1)} == {
        e: "success" for e in range(1, COLOURS_END + 1)}
    tries = {(e, t): ti["try_number"] for (d, e), tis in regions.tis.items() if d == COLOURS
             for t, ti in tis.items() if ti["try_number"] != 1}
    assert tries == {(7, "join2"): 2}, tries
    retry = regions.logs[COLOURS, "join2", 7, 2]
    assert ("join2 epoch 7: its state of epoch 6 was lost with the failed incarnation (log_durability=volatile); "
            "rebuilding the state of epoch 6 with no checkpoint, by replaying the blocks its producers retain: "
            "d3 none; join1 1-6") in retry, retry[-3000:]
    assert "join2 epoch 7: state rebuilt from 6 blocks (7 rows)" in retry
    assert "injected crash: join2 epoch 7 at before-commit" in regions.logs[COLOURS, "join2", 7, 1]
    result = table(store, COLOURS, "result")
    assert result == table(store, COLOURS_REF, "result")
    assert sorted(dict(r)["colour"] for r in result) == ["blue", "green", "green", "green", "green", "red"]
    assert len({dict(r)["pos"] for r in result}) == 6  # no row twice
    # join1's blocks (rows in epochs 3-5) are retained for join2 until the end, then pruned
    assert [regions.retention[COLOURS][e][("join1", "join2")] for e in range(1, COLOURS_END + 1)] == [
        [], [], [3], [3, 4], [3, 4, 5], [3, 4, 5], []]


def test_both_paths_of_a_diamond_fail_in_one_epoch_and_replay_their_source_independently(regions) -> None:
    """S6, the diamond: tally (a running count) and shades (stateless) both read palette, and merge
    reads both; tally and shades are killed in the same epoch and start again without their
    state. tally replays palette's blocks 1-2, shades none; palette is not run again; merge's
    table is the failure-free run's; palette's log is kept for tally (at_end) until the end."""
    store = regions.store
    assert {e: regions.states[PALETTE, e] for e in range(1, PALETTE_END + 1)} == {
        e: "success" for e in range(1, PALETTE_END + 1)}
    tries = {(e, t): ti["try_number"] for (d, e), tis in regions.tis.items() if d == PALETTE
             for t, ti in tis.items() if ti["try_number"] != 1}
    assert tries == {(3, "tally"): 2, (3, "shades"): 2}, tries
    tally = regions.logs[PALETTE, "tally", 3, 2]
    assert ("rebuilding the state of epoch 2 with no checkpoint, by replaying the blocks its producers retain: "
            "palette 1-2") in tally, tally[-3000:]
    assert "tally epoch 3: state rebuilt from 2 blocks (8 rows)" in tally
    shades = regions.logs[PALETTE, "shades", 3, 2]
    assert "shades epoch 3: attempt 2 follows a failed one" in shades and "rebuilding" not in shades, shades[-3000:]
    for task in ("tally", "shades"):
        assert f"injected crash: {task} epoch 3 at before-commit" in regions.logs[PALETTE, task, 3, 1]
    assert table(store, PALETTE, "merge") == table(store, PALETTE_REF, "merge") != []
    assert [regions.retention[PALETTE][e][("palette", "tally")] for e in range(1, PALETTE_END + 1)] == [
        [1], [1, 2], [1, 2, 3], []]


ZOMBIE = """
import json, os, sys
from pyspark.sql import SparkSession
from falkirk.policies.job_spec import JobSpec
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, commit

spec = JobSpec.parse(sys.argv[1:])
store = StoreConfig.from_env()
spark = SparkSession.builder.remote(os.environ["SPARK_REMOTE"]).getOrCreate()
ctx = EpochContext(spec, store, Ledger(store), spark)
# rows the retry never wrote: a zombie need not be deterministic
rows = spark.createDataFrame([(30_000_099, "ada", 1_000_000)], "order_id long, customer string, amount long")
entry = commit(ctx, EpochResult(outputs={"output": rows}))
print(json.dumps({"try_number": entry.try_number, "output_rows": entry.output_rows}))
"""


def test_a_zombie_attempt_committing_after_the_retry_changes_nothing(regions) -> None:
    """S8: clean's attempt 1 of epoch 3 was taken for dead (killed before its commit) and attempt
    2 committed the epoch. Here attempt 1 comes back and commits epoch 3 with rows of its own, as
    a zombie that had passed every check before attempt 2 started would: the commit finds the
    epoch's incarnation already in the table and is a no-op. No table takes a version, the
    ledger keeps attempt 2's row, and nothing downstream sees a row of the zombie."""
    from falkirk.policies.job_spec import JobSpec
    from falkirk.policies.regimes import Regime

    store = regions.store

    def versions() -> dict[str, int]:
        return {t: open_table(store.table_uri(Tier.DURABLE, A, t, "output")).version() for t in TASKS}

    def ledger() -> list[tuple]:
        return sorted((r.task_id, r.epoch, r.try_number, r.incarnation, r.output_rows) for r in Ledger(store).entries(A))

    before = (versions(), ledger(), {t: table(store, A, t) for t in TASKS})
    regime = Regime.parse(dag_module().regimes(END)["clean"].spec())
    spec = JobSpec(dag_id=A, task_id="clean", epoch=3, regime=regime, run_id=run_id_of(3), try_number=1, inputs=("ingest",), task_instance=True)
    done = subprocess.run([sys.executable, "-c", ZOMBIE, *spec.argv()], env={**os.environ, **regions.env},
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["try_number"] == 1  # its own view: it "committed"
    assert "rows, already there)" in done.stderr, done.stderr[-3000:]  # its files were written, never made visible
    assert (versions(), ledger(), {t: table(store, A, t) for t in TASKS}) == before
    assert ("clean", 3, 2, 0) in {r[:4] for r in before[1]}
