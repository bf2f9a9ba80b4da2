"""Time inside an epoch through Airflow: a job killed mid-epoch resumes at its last checkpoint.

``dags/falkirk_loops.py`` runs epochs 1-3 as ``loops_a`` under Airflow (LocalExecutor, one
retry per task instance), its jobs clients of the session's Spark Connect server:

* ``rank`` (PageRank, 30 iterations per epoch, a checkpoint every 5) is killed (SIGKILL) as
  iteration 13 of epoch 2 starts, after its checkpoints at iterations 5 and 10;
* ``tally`` (6 chunks per epoch) is killed in epoch 3 between chunk 4's data files and its commit;
* ``links`` is killed in epoch 2 after its commit and its completion record, before Airflow
  hears of its end.

Airflow retries each; the retry resumes after the last committed checkpoint (the step log
and the job's own log say where), ``links``' retry finds its epoch committed by the attempt
before it and changes nothing, and every table equals ``loops_ref``'s, the same jobs run
without a failure and without Airflow (``python -m devstack.inprocess``).

Then three recoveries, planned and replayed as a user would: ``rank`` fails epoch 4 on both
tries after its checkpoint at iteration 15 (the plan resumes it there); it fails epoch 5
after checkpoints kept in scratch, which is then lost (the plan restores the durable state of
epoch 4 and redoes epoch 5 from its start); it fails epoch 6, whose input is then declared
bad (its checkpoints read that input: epoch 6 starts over). Each ends with the tables of an
uninterrupted run.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from devstack.airflow import AirflowStack
from devstack.demo import dag_epoch_clock, run_id_of
from devstack.inprocess import run_reference_process
from devstack.spark import SparkConnectServer
from falkirk.plugins.recovery import plan, replay
from falkirk.policies.regimes import Tier
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import open_table, scan
from falkirk.policies.store.ledger import Ledger
from falkirk.policies.store.steps import StepLog, table_name
from tests.integration.test_falkirk_view import browser, login, open_view, shot  # noqa: F401 (browser: a fixture)
from tests.oracle import canonical

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DAG_PATH = ROOT / "dags" / "falkirk_loops.py"
A, REF = "loops_a", "loops_ref"
EPOCHS = [1, 2, 3]
DAG_FILE = '''"""Airflow DAG file: a copy of dags/falkirk_loops.py (a DAG factory) with tables of its own."""
import importlib.util

_spec = importlib.util.spec_from_file_location("falkirk_loops_dag", {path!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
loops_a = _module.build_dag("loops_a")
'''
# (task, table, tier): every table the pipeline keeps
TABLES = [("links", "output", Tier.DURABLE), ("rank", "output", Tier.SCRATCH), ("rank", "state", Tier.SCRATCH),
          ("rank", "state", Tier.DURABLE), ("tally", "output", Tier.DURABLE)]


@pytest.fixture(scope="module")
def loops(tmp_path_factory: pytest.TempPathFactory, spark_connect: SparkConnectServer):
    root = tmp_path_factory.mktemp("loops")
    store = StoreConfig(str(root / "durable"), str(root / "scratch"))
    dags = root / "dags"
    dags.mkdir()
    (dags / "loops.py").write_text(DAG_FILE.format(path=str(DAG_PATH)))
    faults = root / "faults"
    faults.write_text(f"{A}/rank:2:iteration-13:once\n{A}/tally:3:chunk-4-after-files:once\n"
                      f"{A}/links:2:after-completion:once\n")
    stack = AirflowStack(home=root / "airflow", store=store, dags_folder=dags, extra_env={
        **spark_connect.airflow_env(), "FALKIRK_CRASH_AT": f"@{faults}"})
    stack.init()
    stack.start()
    try:
        client = stack.client()
        clock = dag_epoch_clock(DAG_PATH)
        client.wait_for_dag(A)
        client.set_paused(A, False)
        for e in EPOCHS:
            client.trigger(A, run_id_of(e), clock.logical_date(e))
        run_reference_process(str(DAG_PATH), REF, "falkirk.spark_jobs.loops", len(EPOCHS),
                              {**store.env(), "SPARK_REMOTE": spark_connect.url})
        states = {e: client.wait_for_run(A, run_id_of(e), timeout=1800) for e in EPOCHS}
        tis = {e: client.task_instances(A, run_id_of(e)) for e in EPOCHS}
        faults_left = faults.read_text()
        logs = {(t, e, n): client.task_log(A, run_id_of(e), t, n) for e in EPOCHS for t in ("links", "rank", "tally")
                for n in range(1, tis[e][t]["try_number"] + 1)}
        outcome = SimpleNamespace(store=store, states=states, tis=tis, logs=logs, faults_left=faults_left,
                                  client=client, stack=stack, faults=faults, clock=clock, remote=spark_connect.url)
        yield outcome
    finally:
        stack.stop()


def fail_twice(loops, epoch: int, iteration: int) -> None:
    """Epoch ``epoch``: rank dies as ``iteration`` starts, on its try and on Airflow's retry."""
    client = loops.client
    loops.faults.write_text(f"{A}/rank:{epoch}:iteration-{iteration}\n")
    client.trigger(A, run_id_of(epoch), loops.clock.logical_date(epoch))
    assert client.wait_for_run(A, run_id_of(epoch), timeout=1800) == "failed"
    loops.faults.write_text("")
    tis = client.task_instances(A, run_id_of(epoch))
    assert {t: (ti["state"], ti["try_number"]) for t, ti in tis.items()} == {
        "links": ("success", 1), "rank": ("failed", 2), "tally": ("success", 1)}


def assert_equals_reference(store: StoreConfig, epochs: int, remote: str) -> None:
    run_reference_process(str(DAG_PATH), REF, "falkirk.spark_jobs.loops", epochs,
                          {**store.env(), "SPARK_REMOTE": remote})
    for task, table, tier in TABLES:
        ref, got = (canonical(scan(open_table(store.table_uri(tier, dag, task, table))).to_pylist())
                    for dag in (REF, A))
        assert ref and got == ref, f"{task} {table} ({tier.value}) differs from the uninterrupted run"


def test_airflow_retried_the_killed_attempts_once(loops) -> None:
    assert loops.states == {1: "success", 2: "success", 3: "success"}
    assert (loops.tis[2]["rank"]["try_number"], loops.tis[3]["tally"]["try_number"],
            loops.tis[2]["links"]["try_number"]) == (2, 2, 2)
    # Any other retry is the machine's (a busy scheduler), not the kills': shown, so that a
    # reader of the test log can tell
    for (t, e, n), log in loops.logs.items():
        if (t, e) not in (("rank", 2), ("tally", 3), ("links", 2)) and n < loops.tis[e][t]["try_number"]:
            print(f"{t} epoch {e} try {n} of {loops.tis[e][t]['try_number']} ended:\n{log[-2000:]}")
    assert loops.faults_left.strip() == ""  # each crash entry fired once and was taken out
    assert "injected crash: rank epoch 2 at iteration-13" in loops.logs["rank", 2, 1]
    assert "injected crash: tally epoch 3 at chunk-4-after-files" in loops.logs["tally", 3, 1]
    assert "injected crash: links epoch 2 at after-completion" in loops.logs["links", 2, 1]


def test_the_retry_of_a_job_killed_after_its_completion_record_changes_nothing(loops) -> None:
    """links' try 1 of epoch 2 committed and recorded its epoch completed, then died: Airflow's
    retry is a retry of that attempt, not a re-run of a completed epoch, so it succeeds without
    running the job, and the ledger keeps try 1's commit alone."""
    assert loops.tis[2]["links"]["state"] == "success"
    assert f"{A}.links epoch 2: already committed (incarnation 0, run {run_id_of(2)}, try 1); nothing to do" in \
        loops.logs["links", 2, 2], loops.logs["links", 2, 2][-3000:]
    assert "already completed" not in loops.logs["links", 2, 2]
    assert [(e.incarnation, e.try_number) for e in Ledger(loops.store).entries(A, "links", include_invalidated=True)
            if e.epoch == 2] == [(0, 1)]


def test_the_retry_of_the_iterative_job_resumed_at_its_last_checkpoint(loops) -> None:
    steps = StepLog(loops.store).of_dag(A)
    # every checkpoint of rank's epoch 2, with the try that committed it: 5 and 10 before the kill,
    # 15-25 by the retry, which redid only iterations 11-30
    assert [(c.step, c.try_number) for c in steps if (c.task_id, c.epoch) == ("rank", 2)] == [
        (5, 1), (10, 1), (15, 2), (20, 2), (25, 2)]
    assert [c.time for c in steps if c.task_id == "rank" and c.epoch != 2] == [
        (1, 5), (1, 10), (1, 15), (1, 20), (1, 25), (3, 5), (3, 10), (3, 15), (3, 20), (3, 25)]
    retry = loops.logs["rank", 2, 2]
    assert "rank epoch 2: resuming at iteration 10 of 30 from its checkpoint" in retry
    assert "skipping 10 iterations" in retry
    assert "checkpoint at iteration 5 of 30" not in retry and "checkpoint at iteration 15 of 30" in retry
    entry = Ledger(loops.store).find(A, "rank", 2)
    assert entry is not None and entry.try_number == 2 and entry.incarnation == 0


def test_the_retry_of_the_chunked_job_redid_the_chunk_whose_commit_it_never_made(loops) -> None:
    steps = [c for c in StepLog(loops.store).of_dag(A) if (c.task_id, c.epoch) == ("tally", 3)]
    # chunk 4's files were written, its commit was not: the retry wrote and committed it again
    assert [(c.step, c.try_number) for c in steps] == [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2)]
    assert "resuming at chunk 3 of 6 from its checkpoint" in loops.logs["tally", 3, 2]
    assert "checkpoint at chunk 3 of 6" in loops.logs["tally", 3, 1]
    assert "checkpoint at chunk 4 of 6" not in loops.logs["tally", 3, 1]
    # the killed attempt's files of chunk 4 stay orphans: the table holds the retry's commit only
    chunk4 = loops.store.table_uri(Tier.DURABLE, A, "tally", table_name("chunk", 4))
    commits = [h for h in open_table(chunk4).history() if h.get("operation") != "DELETE"]
    assert len(commits) == len(EPOCHS)  # one per epoch


def test_an_epochs_step_checkpoints_are_deleted_once_it_commits(loops) -> None:
    for c in StepLog(loops.store).of_dag(A):
        table = open_table(c.uri, loops.store.options_for(c.uri))
        assert table is not None and scan(table, where={"epoch": c.epoch}).num_rows == 0, c


def test_every_table_equals_the_uninterrupted_run(loops) -> None:
    for task, table, tier in TABLES:
        ref, got = (canonical(scan(open_table(loops.store.table_uri(tier, dag, task, table))).to_pylist())
                    for dag in (REF, A))
        assert ref and got == ref, f"{task} {table} ({tier.value}) differs from the uninterrupted run"


def test_a_failed_epoch_is_recovered_from_inside_itself(loops, browser) -> None:
    """rank fails at epoch 4 on both tries, after its checkpoint at iteration 15: the view shows
    how far it got, the plan's frontier for rank is the lex time (4, 15), and the replay resumes there."""
    fail_twice(loops, 4, 18)
    vs = SimpleNamespace(stack=loops.stack)
    context, page = login(browser, vs, "admin")
    try:
        open_view(page, vs, A)
        cell = page.get_by_test_id("cell-rank-4")
        cell.wait_for(timeout=60_000)
        assert cell.get_attribute("data-progress") == "iteration 15 of 30"
        assert "got to iteration 15 of 30 (checkpointed)" in cell.get_attribute("title")
        assert "fk-partial" in cell.get_attribute("class")
        assert page.get_by_test_id("cell-rank-3").get_attribute("data-progress") is None  # committed
        shot(page, "steps-progress")
    finally:
        context.close()
    p = plan(A, loops.store, loops.client, failed_tasks=["rank"])
    print(p.table())
    assert {t.task_id: list(t.rerun) for t in p.tasks if t.rerun} == {"rank": [4]}
    rank = p.task("rank")
    assert (rank.kept_through, rank.restore_from.epoch, rank.resume_from.epoch, rank.resume_from.step) == (3, 3, 4, 15)
    assert "iteration 15 of 30 of epoch 4 (on state of epoch 3)" in p.table()
    replay(p.plan_id, loops.store, loops.client, progress=print)
    assert loops.client.wait_for_run(A, run_id_of(4), timeout=1800) == "success"
    tries = loops.client.task_instances(A, run_id_of(4))["rank"]["try_number"]
    log = loops.client.task_log(A, run_id_of(4), "rank", tries)
    assert "rank epoch 4: resuming at iteration 15 of 30 from its checkpoint" in log
    assert_equals_reference(loops.store, 4, loops.remote)


def test_a_failed_epoch_whose_checkpoints_were_in_lost_scratch_starts_over(loops) -> None:
    """rank's epoch 5 keeps its checkpoints in scratch (lazy_checkpoint(every=2)); it fails after
    iteration 20 on both tries, and the scratch tier is lost: the plan restores rank's durable
    state of epoch 4 and redoes epoch 5 from its start."""
    fail_twice(loops, 5, 23)
    steps = [c for c in StepLog(loops.store).of_dag(A) if (c.task_id, c.epoch) == ("rank", 5)]
    assert [(c.step, c.tier) for c in steps] == [(5, "scratch"), (10, "scratch"), (15, "scratch"), (20, "scratch")]
    shutil.rmtree(f"{loops.store.scratch_uri}/{A}")
    p = plan(A, loops.store, loops.client, failed_tasks=["rank"], lost_scratch=[f"{loops.store.scratch_uri}/{A}"])
    print(p.table())
    rank = p.task("rank")
    assert rank.resume_from is None and rank.restore_from.epoch == 4 and rank.restore_from.tier == "durable"
    assert {t.task_id: list(t.rerun) for t in p.tasks if t.rerun} == {"rank": [5]}
    replay(p.plan_id, loops.store, loops.client, progress=print)
    assert loops.client.wait_for_run(A, run_id_of(5), timeout=1800) == "success"
    tries = loops.client.task_instances(A, run_id_of(5))["rank"]["try_number"]
    log = loops.client.task_log(A, run_id_of(5), "rank", tries)
    assert "rank epoch 5: resuming at" not in log and "checkpoint at iteration 5 of 30" in log
    assert "rank epoch 5: not resuming at iteration 20 of 30: no Delta table" in log  # the runtime agrees
    # rank's scratch output and state now hold epoch 5 only: compare the durable tables and epoch 5
    run_reference_process(str(DAG_PATH), REF, "falkirk.spark_jobs.loops", 5,
                          {**loops.store.env(), "SPARK_REMOTE": loops.remote})
    for task, table, tier in TABLES:
        ref, got = (canonical(scan(open_table(loops.store.table_uri(tier, dag, task, table))).to_pylist())
                    for dag in (REF, A))
        if tier is Tier.SCRATCH:
            ref = [r for r in ref if dict(r)["epoch"] == 5]
        assert ref and got == ref, f"{task} {table} ({tier.value}) differs from the uninterrupted run"


def test_a_failed_epoch_whose_input_was_bad_starts_over(loops) -> None:
    """rank fails epoch 6 on both tries after its checkpoint at iteration 10; then links' epoch 6
    is declared bad. Every checkpoint inside rank's epoch 6 read it: the plan resumes nothing,
    and the runtime, finding links' row rolled back, agrees."""
    fail_twice(loops, 6, 12)
    p = plan(A, loops.store, loops.client, failed_tasks=["rank"], bad_epochs=[("links", 6)])
    print(p.table())
    assert {t.task_id: list(t.rerun) for t in p.tasks if t.rerun} == {"links": [6], "rank": [6], "tally": [6]}
    assert p.task("rank").resume_from is None and p.task("rank").restore_from.epoch == 5
    replay(p.plan_id, loops.store, loops.client, progress=print)
    assert loops.client.wait_for_run(A, run_id_of(6), timeout=1800) == "success"
    tries = loops.client.task_instances(A, run_id_of(6))["rank"]["try_number"]
    log = loops.client.task_log(A, run_id_of(6), "rank", tries)
    assert "rank epoch 6: resuming at" not in log and "checkpoint at iteration 5 of 30" in log
    run_reference_process(str(DAG_PATH), REF, "falkirk.spark_jobs.loops", 6,
                          {**loops.store.env(), "SPARK_REMOTE": loops.remote})
    for task, table, tier in TABLES:
        ref, got = (canonical(scan(open_table(loops.store.table_uri(tier, dag, task, table))).to_pylist())
                    for dag in (REF, A))
        if tier is Tier.SCRATCH:  # lost before epoch 5 was redone (the test before)
            ref = [r for r in ref if dict(r)["epoch"] >= 5]
        assert ref and got == ref, f"{task} {table} ({tier.value}) differs from the uninterrupted run"
