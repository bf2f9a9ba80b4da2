"""The regime tag survives Airflow's DAG serialization, so the API server can read it
without importing DAG files; a wrong regime is refused when the DAG is defined."""

from __future__ import annotations

import re

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def airflow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


def test_regimes_round_trip_through_the_serialized_dag() -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    from falkirk.plugins.task_metadata import regime_of
    from falkirk.policies import Batch, EagerCheckpoint, Ephemeral

    bag = DagBag(str(ROOT / "dags"))
    assert bag.import_errors == {}
    back = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["falkirk_orders"]))
    assert type(back.get_task("aggregate")).__name__ == "SerializedBaseOperator"  # no DAG code behind it
    assert {t.task_id: regime_of(t) for t in back.tasks} == {
        "ingest": Ephemeral(), "aggregate": EagerCheckpoint(), "publish": Batch(log_outputs=True)}
    from falkirk.plugins.task_metadata import epoch_clock_of

    clock = bag.dags["falkirk_orders"].get_task("aggregate").epoch_clock
    assert {t.task_id: epoch_clock_of(t) for t in back.tasks} == {t: clock for t in ("ingest", "aggregate", "publish")}
    from falkirk.policies import LazyCheckpoint

    for dag_id, logs in (("falkirk_readings", True), ("falkirk_readings_discard", False)):
        readings = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags[dag_id]))
        assert {t.task_id: regime_of(t) for t in readings.tasks} == {
            "intake": Ephemeral(), "tally": LazyCheckpoint(every=1, log_outputs=logs), "deliver": Ephemeral()}


def test_operator_refuses_a_regime_that_is_not_one() -> None:
    from datetime import datetime, timedelta, timezone

    from falkirk.plugins.operators import RegimeSparkSubmitOperator
    from falkirk.policies import EpochClock, RegimeError

    clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
    with pytest.raises(RegimeError, match="task 'x': regime='eager' is not a Regime"):
        RegimeSparkSubmitOperator(task_id="x", application=str(ROOT / "spark_jobs/pipeline/ingest.py"),
                                  regime="eager", epoch_clock=clock)


def test_store_credentials_come_from_the_named_airflow_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    from datetime import datetime, timedelta, timezone

    from falkirk.plugins.operators import RegimeSparkSubmitOperator
    from falkirk.policies import EagerCheckpoint, EpochClock, StoreConfig

    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps({
        "conn_type": "aws", "login": "AKIAEXAMPLE", "password": "secret-key-example",
        "extra": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1", "store_uri": "s3://lake/f"}}))
    clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
    op = RegimeSparkSubmitOperator(task_id="x", application=str(ROOT / "spark_jobs/pipeline/ingest.py"),
                                   regime=EagerCheckpoint(), epoch_clock=clock, store_conn_id="lake",
                                   env_vars={"FALKIRK_SCRATCH_URI": "/tmp/scratch"})
    env = op.job_env()
    store = StoreConfig.from_env(env)  # what the job will see
    assert store.durable_uri == "s3://lake/f" and store.scratch_uri == "/tmp/scratch"
    assert store.storage_options == {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret-key-example",
                                     "AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
                                     "AWS_ALLOW_HTTP": "true"}

    monkeypatch.setenv("AIRFLOW_CONN_PG", json.dumps({"conn_type": "postgres", "login": "u"}))
    op.store_conn_id = "pg"
    with pytest.raises(ValueError, match="connection 'pg': type 'postgres' cannot hold store credentials"):
        op.job_env()


def test_the_store_hook_reads_a_falkirk_store_connection_or_falls_back_to_the_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import json

    from falkirk.plugins.store_hook import FalkirkStoreHook
    from falkirk.policies import StoreError

    monkeypatch.setenv("FALKIRK_STORE_URI", str(tmp_path / "env-store"))
    monkeypatch.delenv("FALKIRK_SCRATCH_URI", raising=False)
    assert FalkirkStoreHook().get_store().durable_uri == str(tmp_path / "env-store")  # no falkirk_default
    with pytest.raises(StoreError, match="connection 'lake' is not defined: create it"):
        FalkirkStoreHook("lake").get_store()

    monkeypatch.setenv("AIRFLOW_CONN_FALKIRK_DEFAULT", json.dumps({
        "conn_type": "falkirk_store", "login": "KEY", "password": "SECRET",
        "extra": {"store_uri": "s3://lake/falkirk", "scratch_uri": "/mnt/scratch", "endpoint_url": "https://s3.x"}}))
    store = FalkirkStoreHook().get_store()
    assert (store.durable_uri, store.scratch_uri) == ("s3://lake/falkirk", "/mnt/scratch")
    assert store.storage_options == {"AWS_ACCESS_KEY_ID": "KEY", "AWS_SECRET_ACCESS_KEY": "SECRET",
                                     "AWS_ENDPOINT_URL": "https://s3.x"}


def test_jobs_by_module_name_and_depends_on_past_from_the_regime() -> None:
    from datetime import datetime, timedelta, timezone

    from falkirk.plugins.operators import RegimeSparkSubmitOperator
    from falkirk.policies import Batch, EagerCheckpoint, EpochClock, LazyCheckpoint

    clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
    ops = {regime.spec(): RegimeSparkSubmitOperator(task_id=f"t{i}", application="falkirk.spark_jobs.pipeline.ingest",
                                                    regime=regime, epoch_clock=clock)
           for i, regime in enumerate((Batch(), EagerCheckpoint(), LazyCheckpoint(every=2)))}
    assert {k: op.depends_on_past for k, op in ops.items()} == {
        "batch(log_outputs=false)": False, "eager_checkpoint": True,
        "lazy_checkpoint(every=2, log_outputs=false)": True}
    assert ops["eager_checkpoint"].application == str(ROOT / "spark_jobs" / "pipeline" / "ingest.py")
    explicit = RegimeSparkSubmitOperator(task_id="x", application="falkirk.spark_jobs.pipeline.ingest",
                                         regime=Batch(), epoch_clock=clock, depends_on_past=True)
    assert explicit.depends_on_past
    with pytest.raises(FileNotFoundError, match="'falkirk.spark_jobs.nope' is neither a file nor an importable"):
        RegimeSparkSubmitOperator(task_id="x", application="falkirk.spark_jobs.nope", regime=Batch(),
                                  epoch_clock=clock)


def test_the_taskflow_form_refuses_what_a_task_could_not_find_where_it_runs() -> None:
    from falkirk.plugins.taskflow import falkirk_task
    from falkirk.policies import Batch

    with pytest.raises(TypeError, match="needs regime="):
        falkirk_task(lambda ctx: None)

    def outer():
        @falkirk_task(regime=Batch())
        def inner(ctx):
            return None

    with pytest.raises(TypeError, match="must be a function defined at the top level of the DAG file"):
        outer()


MAPPED_DAG = '''
from datetime import datetime, timedelta, timezone
from airflow.sdk import DAG
from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.taskflow import falkirk_task
from falkirk.policies import EagerCheckpoint, EpochClock

CLOCK = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))

@falkirk_task(regime=EagerCheckpoint())
def totals(ctx):
    return None

with DAG("{dag_id}", schedule=None, default_args={{"epoch_clock": CLOCK}}):
    {mapping}
'''


@pytest.mark.parametrize("form, mapping, message", [
    ("operator", 'RegimeSparkSubmitOperator.partial(task_id="shard", application="falkirk.spark_jobs.pipeline.ingest", '
                 'regime=EagerCheckpoint()).expand(conf=[{"a": "1"}, {"a": "2"}])', ".expand(conf=...) maps over conf"),
    ("taskflow", 'totals.expand(conf=[{"a": "1"}, {"a": "2"}])', ".expand(conf=...) maps over conf"),
    ("taskflow partial", 'totals.partial(task_id="totals").expand(partition=[1, 2])',
     "partition=[1, 2] is not a fixed count: give range(N)"),
])
def test_a_falkirk_task_is_mapped_only_into_partitions(form: str, mapping: str, message: str, tmp_path: Path) -> None:
    """Instances mapped over anything but the partition would commit the same tables at the same
    epoch: the DAG file fails to import, naming the task and the form that works."""
    from airflow.dag_processing.dagbag import DagBag

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "mapped.py").write_text(MAPPED_DAG.format(dag_id="mapped", mapping=mapping))
    bag = DagBag(str(dags))
    assert "mapped" not in bag.dags
    [error] = bag.import_errors.values()
    task = "shard" if form == "operator" else "totals"
    assert f"task {task!r}: {message}" in error, error
    assert f".partial(task_id={task!r}, ...).expand(partition=range(N))" in error, error


@pytest.mark.parametrize("mapping", [
    'RegimeSparkSubmitOperator.partial(task_id="totals", application="falkirk.spark_jobs.pipeline.ingest", '
    'regime=EagerCheckpoint()).expand(partition=range(4))',
    "totals.expand(partition=range(4))",
])
def test_a_partitioned_task_keeps_regime_clock_and_count_through_serialization(mapping: str, tmp_path: Path) -> None:
    """The API server reads a partitioned task from the serialized DAG: regime, epoch clock and
    partition count; the scheduler runs its stateful partitions' epochs in order."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    from falkirk.plugins.task_metadata import epoch_clock_of, partitions_of, regime_of
    from falkirk.policies import EagerCheckpoint

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "mapped.py").write_text(MAPPED_DAG.format(dag_id="mapped", mapping=mapping))
    bag = DagBag(str(dags))
    assert bag.import_errors == {}
    task = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["mapped"])).get_task("totals")
    assert type(task).__name__ == "SerializedMappedOperator"
    assert (regime_of(task), partitions_of(task), task.depends_on_past) == (EagerCheckpoint(), 4, True)
    assert epoch_clock_of(task) == bag.dags["mapped"].default_args["epoch_clock"]


def test_an_airflow_rerun_of_a_completed_epoch_is_refused_and_a_retry_after_a_commit_is_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The rule a job applies as an Airflow task instance, before starting Spark: a committed
    epoch whose task instance went on to complete is refused (Clear, backfill), naming the plan;
    one whose attempt died after the commit is not (its retry is an idempotent no-op that records
    the completion); an epoch a recovery rolled back runs again. Outside Airflow (a job run by
    hand) nothing is refused or recorded."""
    from falkirk.policies import EagerCheckpoint, Ledger, LedgerEntry, StoreConfig
    from falkirk.policies.job_spec import REFUSAL_PREFIX, REFUSED_EXIT_CODE, JobSpec
    from falkirk.policies.store.control import Completions
    from falkirk.policies.store.ledger import LedgerSnapshot
    from falkirk.spark_jobs.runtime import already_committed as decide

    def already_committed(spec, store, ledger):  # each decision reads the ledger as a job does
        return decide(spec, store, LedgerSnapshot(ledger, spec.dag_id))

    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    ledger = Ledger(store)
    spec = JobSpec(dag_id="d", task_id="agg", epoch=2, regime=EagerCheckpoint(), run_id="epoch-2", try_number=2,
                   task_instance=True)
    by_hand = JobSpec(dag_id="d", task_id="agg", epoch=2, regime=EagerCheckpoint(), run_id="epoch-2")
    assert already_committed(spec, store, ledger) is None  # nothing committed: runs
    row = LedgerEntry(dag_id="d", task_id="agg", epoch=2, regime="eager_checkpoint", run_id="epoch-2", try_number=1)
    ledger.append(row)
    assert already_committed(by_hand, store, ledger) == 0 and not Completions(store).completed(row)
    # committed, then the attempt died: the retry is a no-op, and its task instance completes
    assert already_committed(spec, store, ledger) == 0 and Completions(store).completed(row)
    capsys.readouterr()
    assert already_committed(spec, store, ledger) == REFUSED_EXIT_CODE
    said = [line[len(REFUSAL_PREFIX):] for line in capsys.readouterr().out.splitlines()
            if line.startswith(REFUSAL_PREFIX)]
    refusal = "\n".join(said)
    assert said[0] == "agg epoch 2 already completed (committed by run epoch-2, try 1) and no recovery has rolled it back:"
    # the plan it names, with its size as `falkirk plan` computes it from the ledger
    [command] = [line for line in said if line.startswith("    falkirk plan ")]
    assert re.fullmatch(r"    falkirk plan --dag d --bad-epoch agg:2 \(re-runs \d+ task instances, through epoch 2\)",
                        command), command
    assert "    falkirk replay PLAN_ID" in said
    assert max(len(line) for line in said) <= 110  # Airflow's log viewer shows it without scrolling
    assert f"    falkirk keep --dag d --run {spec.run_id} --yes" in said
    assert already_committed(by_hand, store, ledger) == 0  # by hand: the no-op it always was
    ledger.invalidations.record([row], "plan-1")  # a recovery rolled it back: it runs again
    assert already_committed(spec, store, ledger) is None
    redone = LedgerEntry(dag_id="d", task_id="agg", epoch=2, regime="eager_checkpoint", run_id="epoch-2", try_number=3, incarnation=1)
    ledger.append(redone)
    assert already_committed(spec, store, ledger) == 0  # the redo's attempt died after its commit: a no-op


def test_a_retry_of_an_attempt_that_completed_before_airflow_heard_of_it_is_a_no_op_and_a_clear_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Try 1 of epoch-2 committed and recorded its completion, then its end was lost: its process
    was killed, or its scheduler missed its heartbeats and Airflow reset the instance as orphaned
    (try 2 with ``max_tries`` unchanged). Try 2 is a retry of the same clearing
    (:func:`~falkirk.policies.job_spec.first_try` 1): it changes nothing and exits 0 with the
    commit's record, for its asset events. After a Clear (``max_tries`` = 1 + retries, first try 2),
    or in another run of the same epoch, the same commit is refused."""
    from falkirk.policies import EagerCheckpoint, Ledger, LedgerEntry, StoreConfig
    from falkirk.policies.asset_events import CommittedEpoch
    from falkirk.policies.job_spec import REFUSED_EXIT_CODE, JobSpec, first_try
    from falkirk.policies.store.control import Completions
    from falkirk.policies.store.ledger import LedgerSnapshot
    from falkirk.spark_jobs.runtime import already_committed

    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    ledger = Ledger(store)
    row = LedgerEntry(dag_id="d", task_id="agg", epoch=2, regime="eager_checkpoint", run_id="epoch-2", try_number=1)
    ledger.append(row)
    Completions(store).record(row)

    def decision(run_id: str, try_number: int, max_tries: int, retries: int) -> int | None:
        spec = JobSpec(dag_id="d", task_id="agg", epoch=2, regime=EagerCheckpoint(), run_id=run_id,
                       try_number=try_number, first_try=first_try(try_number, max_tries, retries), task_instance=True)
        return already_committed(spec, store, LedgerSnapshot(ledger, "d"))

    capsys.readouterr()
    assert decision("epoch-2", 2, max_tries=0, retries=0) == 0  # reset as orphaned
    assert CommittedEpoch.from_entry(row).line() in capsys.readouterr().out
    assert decision("epoch-2", 2, max_tries=1, retries=1) == 0  # retried after its process was killed
    assert decision("epoch-2", 3, max_tries=0, retries=0) == 0  # reset twice
    assert decision("epoch-2", 2, max_tries=1, retries=0) == REFUSED_EXIT_CODE  # cleared after try 1
    assert decision("epoch-2", 3, max_tries=3, retries=1) == REFUSED_EXIT_CODE  # cleared after try 2
    assert decision("backfill-2", 2, max_tries=1, retries=1) == REFUSED_EXIT_CODE  # another run of the epoch


def _context(epoch_day: int, triggering_user: str | None = None):
    from datetime import datetime, timezone
    from types import SimpleNamespace

    run = SimpleNamespace(logical_date=datetime(2026, 1, epoch_day, tzinfo=timezone.utc), run_id=f"r{epoch_day}",
                          triggering_user_name=triggering_user)
    return {"dag_run": run, "ti": SimpleNamespace(try_number=1, map_index=-1)}


def _ingest():
    from datetime import datetime, timedelta, timezone

    from falkirk.plugins.operators import RegimeSparkSubmitOperator
    from falkirk.policies import Ephemeral, EpochClock

    clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
    return RegimeSparkSubmitOperator(task_id="ingest", application="falkirk.spark_jobs.pipeline.ingest",
                                     regime=Ephemeral(), epoch_clock=clock)


def test_a_missing_store_fails_the_task_in_its_own_error_before_spark_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from falkirk.policies import StoreError

    for name in ("FALKIRK_STORE_URI", "FALKIRK_SCRATCH_URI", "AIRFLOW_CONN_FALKIRK_DEFAULT"):
        monkeypatch.delenv(name, raising=False)
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))  # spark-submit's way in
    with pytest.raises(StoreError) as refused:
        _ingest().execute(_context(2))
    assert str(refused.value) == ("FALKIRK_STORE_URI is not set: set it to a local directory or an s3:// URI for "
                                  "the durable store")
    assert started == []


def test_a_dags_test_run_gets_a_fresh_store_of_its_own_unless_told_otherwise(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from falkirk.plugins.dags_test import dags_test_store, is_dags_test, run_key
    from falkirk.policies import StoreConfig, StoreError

    real = StoreConfig(str(tmp_path / "real" / "durable"), str(tmp_path / "real" / "scratch"))
    assert is_dags_test(_context(1, "dag_test")) and not is_dags_test(_context(1, "admin"))
    # fresh per test: a run tested again is cleared first, which counts in its key
    first, again = (dags_test_store(real, "d", run_key({"run_id": "manual__x", "clear_number": n}), {})
                    for n in (0, 1))
    assert first.durable_uri.endswith("/falkirk-dags-test/d/manual__x-0/durable")
    assert again.durable_uri.endswith("/falkirk-dags-test/d/manual__x-1/durable")
    assert dags_test_store(real, "d", "k", {"FALKIRK_DAGS_TEST_STORE": "real"}) == real
    mine = dags_test_store(real, "d", "k", {"FALKIRK_DAGS_TEST_STORE": str(tmp_path / "try")})
    assert (mine.durable_uri, mine.scratch_uri) == (str(tmp_path / "try/d/durable"), str(tmp_path / "try/d/scratch"))
    with pytest.raises(StoreError, match="FALKIRK_DAGS_TEST_STORE='s3://b/x': give a local directory"):
        dags_test_store(real, "d", "k", {"FALKIRK_DAGS_TEST_STORE": "s3://b/x"})


def test_spark_default_runs_on_local_2_when_it_is_not_defined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    conn = _ingest()._spark_connection()
    assert (conn.conn_type, conn.host) == ("spark", "local[2]")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "spark://h:7077"}')
    assert _ingest()._spark_connection().host == "spark://h:7077"


def test_a_non_deterministic_task_must_log_its_outputs_and_its_sink_names_it_as_a_concurrent_input() -> None:
    """deterministic=False with outputs in scratch is refused with the fix; a concurrent input
    becomes an input of the job (recorded in the ledger) without an Airflow edge, and must be a
    task of the DAG that is not also linked with >>."""
    from datetime import datetime, timedelta, timezone
    from types import SimpleNamespace

    from airflow.sdk import DAG

    from falkirk.plugins.operators import RegimeSparkSubmitOperator
    from falkirk.plugins.timetable import EpochTimetable
    from falkirk.policies import Batch, EagerCheckpoint, EpochClock, LazyCheckpoint, RegimeError

    clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))

    app = "falkirk.spark_jobs.sampled.draw"
    with pytest.raises(RegimeError, match=r"task 'draw': deterministic=False with regime batch\(log_outputs=false\), "
                                          r"which keeps its outputs in scratch.*Use Batch\(log_outputs=True\)"):
        RegimeSparkSubmitOperator(task_id="draw", application=app, regime=Batch(), deterministic=False)
    with pytest.raises(RegimeError, match="lazy_checkpoint"):
        RegimeSparkSubmitOperator(task_id="draw", application=app, regime=LazyCheckpoint(every=2), deterministic=False)
    with pytest.raises(TypeError, match=r"concurrent_inputs='draw': give a list of task ids"):
        RegimeSparkSubmitOperator(task_id="s", application=app, regime=Batch(), concurrent_inputs="draw")

    def spec_of(dag: DAG, task_id: str):
        context = {"dag_run": SimpleNamespace(logical_date=datetime(2026, 1, 2, tzinfo=timezone.utc), run_id="r"),
                   "ti": SimpleNamespace(map_index=-1, try_number=1)}
        return dag.get_task(task_id).job_spec(context)

    with DAG("d", schedule=EpochTimetable(clock), start_date=clock.first) as dag:
        RegimeSparkSubmitOperator(task_id="draw", application=app, regime=EagerCheckpoint(), deterministic=False)
        RegimeSparkSubmitOperator(task_id="deliver", application=app, regime=Batch(), concurrent_inputs=["draw"])
        RegimeSparkSubmitOperator(task_id="lost", application=app, regime=Batch(), concurrent_inputs=["drw"])
    draw, deliver = spec_of(dag, "draw"), spec_of(dag, "deliver")
    assert (draw.deterministic, "--nondeterministic" in draw.argv()) == (False, True)
    assert (deliver.inputs, deliver.deterministic, dag.get_task("deliver").upstream_task_ids) == (("draw",), True, set())
    with pytest.raises(ValueError, match=r"lost: concurrent_inputs names 'drw', which DAG 'd' does not have; "
                                         r"its tasks are \['deliver', 'draw', 'lost'\]"):
        spec_of(dag, "lost")
    with DAG("e", schedule=EpochTimetable(clock), start_date=clock.first) as linked:
        up = RegimeSparkSubmitOperator(task_id="draw", application=app, regime=Batch())
        up >> RegimeSparkSubmitOperator(task_id="deliver", application=app, regime=Batch(), concurrent_inputs=["draw"])
    with pytest.raises(ValueError, match="also linked to it with >>: a concurrent input runs beside this task"):
        spec_of(linked, "deliver")


def test_a_partitions_refusal_names_the_partition_and_its_plan() -> None:
    from falkirk.policies.job_spec import JobSpec, completed_epoch_refusal
    from falkirk.policies.regimes import EagerCheckpoint

    spec = JobSpec(dag_id="words", task_id="tokenize", epoch=8, regime=EagerCheckpoint(), run_id="epoch-8", map_index=1, partitions=4)
    text = completed_epoch_refusal(spec, "epoch-8", 1, " (re-runs 13 task instances, through epoch 9)")
    assert text.startswith("tokenize[1] epoch 8 already completed")
    assert "    falkirk plan --dag words --bad-epoch tokenize[1]:8 (re-runs 13 task instances, through epoch 9)" in \
        text.splitlines()


def test_a_paired_task_maps_into_two_replicas_per_partition_and_its_readers_wait_for_them_to_be_done(
        tmp_path: Path) -> None:
    """``ProcessPairs()`` with ``.expand(partition=range(4))``: 8 task instances (replicas A and B of
    partition p at map indexes 2p and 2p+1), never retried; a task reading it runs once its
    replicas are done (a taken-over replica ends skipped, a lost one may end failed); a paired
    task that is not partitioned is refused, naming the fix."""
    import shutil

    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    from falkirk.plugins.task_metadata import partitions_of, regime_of
    from falkirk.policies import ProcessPairs

    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "dags" / "falkirk_pairs.py", dags / "falkirk_pairs.py")
    bag = DagBag(str(dags))
    assert bag.import_errors == {}
    dag = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["falkirk_pairs"]))
    sessions, stats = dag.get_task("sessions"), dag.get_task("stats")
    assert (regime_of(sessions), partitions_of(sessions)) == (ProcessPairs(), 4)
    assert sessions.expand_input.value["partition"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert sessions.partial_kwargs.get("retries", sessions.retries) == 0
    assert (sessions.trigger_rule, stats.trigger_rule) == ("all_success", "all_done")
    (dags / "unpartitioned.py").write_text(MAPPED_DAG.format(dag_id="unpartitioned", mapping=(
        'RegimeSparkSubmitOperator(task_id="pair", application="falkirk.spark_jobs.pipeline.ingest", '
        'regime=ProcessPairs())')).replace("EagerCheckpoint, EpochClock", "EagerCheckpoint, EpochClock, ProcessPairs"))
    errors = DagBag(str(dags)).import_errors
    [error] = [e for path, e in errors.items() if "unpartitioned" in path]
    assert "process_pairs runs each partition twice: partition the task with .partial(task_id='pair', ...)" in error


def test_the_commit_record_is_read_from_spark_submit_output_and_put_in_each_asset_event(
        capsys: pytest.CaptureFixture[str]) -> None:
    """On ``spark-submit`` the provider's hook reads the job's output; the operator reads the
    commit line from the same lines (the last one wins: a retry's no-op repeats it) and puts
    the record in the extra of each Asset among its outlets, and of nothing else."""
    from datetime import datetime, timedelta, timezone
    from types import SimpleNamespace

    from airflow.sdk import DAG, Asset

    from falkirk.plugins.operators import RegimeSparkSubmitOperator
    from falkirk.policies import Batch, EpochClock
    from falkirk.policies.asset_events import CommittedEpoch, CommittedOutput

    clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
    ranking = Asset("orders.ranking")
    with DAG("orders", schedule=None, start_date=clock.first):
        op = RegimeSparkSubmitOperator(task_id="publish", application="falkirk.spark_jobs.pipeline.publish",
                                       regime=Batch(log_outputs=True), epoch_clock=clock, outlets=[ranking])
    done = CommittedEpoch(dag_id="orders", task_id="publish", epoch=2, incarnation=1,
                          outputs=(CommittedOutput("output", "/s/orders/publish/output", 4, 5),))
    hook = op._get_hook()
    hook._process_spark_submit_log(iter(["[falkirk] publish epoch 2: starting\n", done.line() + "\n",
                                         "done\n"]))
    assert op._committed == done
    assert "[falkirk] committed: " in capsys.readouterr().out  # the task's log still shows every line

    events = {ranking: SimpleNamespace(extra={})}
    op._describe_asset_events({"outlet_events": events}, op._committed)
    assert events[ranking].extra == {"falkirk": {
        "dag_id": "orders", "task_id": "publish", "epoch": 2, "incarnation": 1, "replacement": True,
        "outputs": {"output": {"uri": "/s/orders/publish/output", "version": 4, "rows": 5}}}}


@pytest.mark.parametrize("record, field", [
    ("not an object", "is str, not an object"),
    ({"dag_id": "d", "task_id": "t", "epoch": "3", "incarnation": 0}, "epoch='3' is not a int"),
    ({"dag_id": "d", "task_id": "t", "epoch": 3, "incarnation": True}, "incarnation=True is not a int"),
    ({"dag_id": "d", "task_id": "t", "epoch": 3, "incarnation": 0, "map_index": "2"}, "map_index='2' is not a int"),
    ({"dag_id": "d", "task_id": "t", "epoch": 3, "incarnation": 0, "outputs": {"output": {"uri": "/x"}}},
     "outputs: each needs uri, version and rows"),
])
def test_an_asset_event_extra_that_is_not_a_commit_record_is_refused_naming_the_field(record, field) -> None:
    from falkirk.policies.asset_events import AssetEventError, CommittedEpoch

    with pytest.raises(AssetEventError, match=re.escape(field)):
        CommittedEpoch.from_extra({"falkirk": record})


def test_a_partitions_commit_record_round_trips_through_its_line_and_extra() -> None:
    from falkirk.policies.asset_events import CommittedEpoch, CommittedOutput

    done = CommittedEpoch(dag_id="clicks", task_id="tally", epoch=4, incarnation=0, map_index=3,
                          outputs=(CommittedOutput("counts", "/s/clicks/tally/counts/3", 11, 2),
                                   CommittedOutput("output", "/s/clicks/tally/output/3", 12, 7)))
    assert CommittedEpoch.parse_line(done.line()) == CommittedEpoch.from_extra(done.extra()) == done
    assert done.extra()["falkirk"]["map_index"] == 3 and done.processor == "tally[3]" and not done.replacement
    assert "map_index" not in CommittedEpoch(dag_id="clicks", task_id="tally", epoch=4).extra()["falkirk"]
    assert CommittedEpoch.parse_line("[falkirk] tally epoch 4: committed 7 output rows") is None


def _orders_and_leaders():
    """A producer task with partitioned outlets and a consumer task on the same epoch clock."""
    from datetime import datetime, timedelta, timezone

    from airflow.sdk import DAG, Asset

    from falkirk.plugins.operators import RegimeSparkSubmitOperator
    from falkirk.policies import Batch, EagerCheckpoint, EpochClock

    clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
    ranking = Asset("orders.ranking")
    with DAG("orders", schedule=None, start_date=clock.first):
        publish = RegimeSparkSubmitOperator(task_id="publish", application="falkirk.spark_jobs.pipeline.publish",
                                            regime=Batch(log_outputs=True), epoch_clock=clock, outlets=[ranking],
                                            partition_outlets=True)
    with DAG("leaders", schedule=None, start_date=clock.first):
        leaders = RegimeSparkSubmitOperator(task_id="leaders", application="falkirk.spark_jobs.pipeline.leaders",
                                            regime=EagerCheckpoint(), epoch_clock=clock)
    return clock, ranking, publish, leaders


def test_partition_outlets_key_each_asset_event_by_its_epochs_date() -> None:
    """Airflow's own outlet accessor: the extra holds the commit, the partition key the date of
    its epoch (a redo's event has its epoch's key, so it reaches the same consumer partition)."""
    from airflow.sdk.definitions.asset import AssetUniqueKey
    from airflow.sdk.execution_time.context import OutletEventAccessor

    from falkirk.policies.asset_events import CommittedEpoch

    clock, ranking, publish, _ = _orders_and_leaders()
    for done in (CommittedEpoch(dag_id="orders", task_id="publish", epoch=3), CommittedEpoch(dag_id="orders", task_id="publish", epoch=3, incarnation=1)):
        events = {ranking: OutletEventAccessor(key=AssetUniqueKey.from_asset(ranking))}
        publish._describe_asset_events({"outlet_events": events}, done)
        assert events[ranking].partition_keys == {"2026-01-03T00:00:00"}
        assert events[ranking].extra["falkirk"]["incarnation"] == done.incarnation
    publish.partition_outlets = False
    events = {ranking: OutletEventAccessor(key=AssetUniqueKey.from_asset(ranking))}
    publish._describe_asset_events({"outlet_events": events}, CommittedEpoch(dag_id="orders", task_id="publish", epoch=3))
    assert events[ranking].partition_keys == set()  # plain consumers (schedule=[asset]) still run on it


def test_a_run_started_by_asset_events_runs_its_partitions_epoch_and_hands_the_job_what_it_consumed() -> None:
    """A run Airflow started on asset events has no logical date: its epoch comes from its
    partition key (or date); its Falkirk events, from Airflow's triggering-event accessor, reach
    the job's spec oldest first, an event of a plain task left out."""
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from airflow.sdk.execution_time.comms import AssetEventDagRunReferenceResult
    from airflow.sdk.execution_time.context import TriggeringAssetEventsAccessor

    from falkirk.policies.asset_events import CommittedEpoch, ConsumedEvent
    from falkirk.policies.job_spec import JobSpec

    _, _, _, leaders = _orders_and_leaders()

    def event(extra: dict, minute: int) -> AssetEventDagRunReferenceResult:
        return AssetEventDagRunReferenceResult(
            asset={"name": "orders.ranking", "uri": "orders.ranking", "extra": {}}, extra=extra,
            source_task_id="publish", source_dag_id="orders", source_run_id="epoch-3", source_map_index=-1,
            source_aliases=[], timestamp=datetime(2026, 1, 5, 0, minute, tzinfo=timezone.utc),
            partition_key="2026-01-03T00:00:00")

    redo, first = CommittedEpoch(dag_id="orders", task_id="publish", epoch=3, incarnation=1), CommittedEpoch(dag_id="orders", task_id="publish", epoch=3)
    triggering = TriggeringAssetEventsAccessor.build([event(redo.extra(), 9), event({"by": "hand"}, 5),
                                                      event(first.extra(), 1)])
    run = SimpleNamespace(logical_date=None, partition_date=None, partition_key="2026-01-03T00:00:00",
                          run_id="asset_triggered__2026-01-05")
    context = {"dag_run": run, "ti": SimpleNamespace(map_index=-1, try_number=1), "triggering_asset_events": triggering}
    spec = leaders.job_spec(context)
    assert spec.epoch == 3
    assert spec.consumed == (ConsumedEvent("orders.ranking", first), ConsumedEvent("orders.ranking", redo))
    assert JobSpec.parse(spec.argv()) == spec
    # a temporal mapper's partition date wins over the key
    run.partition_date, run.partition_key = datetime(2026, 1, 4, tzinfo=timezone.utc), "2026-01-04"
    assert leaders.job_spec(context).epoch == 4
    run.partition_date, run.partition_key = None, "eu-west"
    with pytest.raises(RuntimeError, match=r"has no logical date .* Schedule leaders with "
                                           r"PartitionedAssetTimetable\(assets=\.\.\.\) on assets whose Falkirk "
                                           r"producer task sets partition_outlets=True"):
        leaders.job_spec(context)


def test_partition_outlets_must_be_a_bool() -> None:
    from airflow.sdk import DAG

    from falkirk.plugins.operators import RegimeSparkSubmitOperator
    from falkirk.policies import Batch

    clock, *_ = _orders_and_leaders()
    with DAG("orders", schedule=None), pytest.raises(TypeError, match="partition_outlets='yes': give True or False"):
        RegimeSparkSubmitOperator(task_id="publish", application="falkirk.spark_jobs.pipeline.publish",
                                  regime=Batch(), epoch_clock=clock, partition_outlets="yes")


def test_the_openlineage_provider_gets_the_epoch_its_commit_and_the_tables_read_from_the_jobs_output() -> None:
    """Airflow's OpenLineage provider picks its default extractor for the operator (it has
    ``get_openlineage_facets_on_complete``); the lineage comes from the job's two lines, read
    from spark-submit's output: the commit (outputs at their versions) and the tables read."""
    from datetime import datetime, timedelta, timezone

    from airflow.providers.openlineage.extractors.base import DefaultExtractor
    from airflow.providers.openlineage.extractors.manager import ExtractorManager
    from airflow.sdk import DAG

    from falkirk.plugins.operators import RegimeSparkSubmitOperator
    from falkirk.policies import Batch, EpochClock
    from falkirk.policies.asset_events import CommittedEpoch, CommittedOutput
    from falkirk.policies.job_spec import JobSpec
    from falkirk.policies.lineage import TableRead, reads_line

    clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
    with DAG("orders", schedule=None, start_date=clock.first):
        op = RegimeSparkSubmitOperator(task_id="publish", application="falkirk.spark_jobs.pipeline.publish",
                                       regime=Batch(log_outputs=True), epoch_clock=clock)
    extractor = ExtractorManager().get_extractor_class(op)
    assert extractor is DefaultExtractor
    assert extractor(op).extract_on_complete(None) is None  # before execute: no epoch, no lineage

    op._spec = JobSpec(dag_id="orders", task_id="publish", epoch=2, regime=Batch(log_outputs=True), run_id="r",
                       try_number=2)
    failed = extractor(op).extract_on_failure(None)
    assert (failed.inputs, failed.outputs) == ([], [])
    facet = failed.run_facets["falkirk"]
    assert (facet.epoch, facet.incarnation, facet.committed) == (2, None, False)

    done = CommittedEpoch(dag_id="orders", task_id="publish", epoch=2, incarnation=1,
                          outputs=(CommittedOutput("output", "s3://lake/orders/publish/output", 4, 5),))
    read = TableRead(dag_id="orders", task_id="aggregate", epoch=2, incarnation=1, output="output", uri="/disk/scratch/orders/aggregate/output", version=3)
    op._get_hook()._process_spark_submit_log(iter([reads_line([read]) + "\n", done.line() + "\n"]))
    lineage = extractor(op).extract_on_complete(None)
    assert [(d.namespace, d.name, d.facets["version"].datasetVersion) for d in lineage.inputs] == [
        ("file", "/disk/scratch/orders/aggregate/output", "3")]
    assert [(d.namespace, d.name, d.facets["version"].datasetVersion, d.outputFacets["outputStatistics"].rowCount)
            for d in lineage.outputs] == [("s3://lake", "orders/publish/output", "4", 5)]
    facet = lineage.run_facets["falkirk"]
    assert (facet.dag_id, facet.task_id, facet.epoch, facet.incarnation, facet.replacement, facet.committed,
            facet.regime) == ("orders", "publish", 2, 1, True, True, "batch(log_outputs=true)")
