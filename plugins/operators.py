"""The regime-aware Spark operator: one task instance runs one epoch of a Spark job.

It is the Spark provider's ``SparkSubmitOperator`` (so ``spark_default`` or any Spark
connection chooses the cluster), plus:

* it tags the task with a fault-tolerance :class:`~falkirk.policies.regimes.Regime`;
* it turns the DAG run's logical date into an epoch with the DAG's
  :class:`~falkirk.policies.epochs.EpochClock`;
* it passes the job the :class:`~falkirk.policies.job_spec.JobSpec` the runtime expects, with
  the task's direct upstream tasks as its inputs, and ``concurrent_inputs``: tasks of the same
  DAG run that it reads *while they run* (no Airflow edge: the two run side by side, see
  :mod:`falkirk.spark_jobs.marker_edge`), recorded in the ledger like any input;
* ``deterministic=False`` says a re-run may compute other results (sampling, the wall clock,
  an external call): the job then saves its determinants durably (its checkpoints inside the
  epoch, and its outputs, which the regime must log) before a sink commits what derives
  from them;
* on a connection of type ``spark_connect`` (a Spark Connect server, ``sc://host:port``)
  it runs the job's Python file as a Spark Connect client instead of going through
  ``spark-submit``, on the worker's warm job host (:class:`~falkirk.plugins.job_hook.FalkirkJobHook`):
  no JVM and no cold interpreter per task, which suits many small epochs;
* it reads nothing from the store itself: the job decides whether its epoch runs, is an
  idempotent no-op (a retry after a commit), or is refused (Airflow re-running an epoch whose
  task instance completed), which fails the task instance without retries;
* given ``outlets=[Asset(...)]``, it puts the commit behind each asset event in the event's
  ``extra`` (the epoch, its incarnation, each output table's Delta version: see
  :mod:`falkirk.policies.asset_events`), so a DAG scheduled on the Asset knows which epoch,
  and which redo of it, its run consumed; with ``partition_outlets=True`` each event also
  carries its epoch's logical date as its partition key, so that a consumer DAG scheduled with
  ``PartitionedAssetTimetable`` gets one run per epoch (or, through a rollup mapper, one per
  several);
* in a DAG run started by such events (which has no logical date) it takes the epoch from the
  run's partition date or key, and hands the job the commits the run consumed: the job's
  ``ctx.read_asset(name)`` reads them, and its ledger row records which producer epochs, and
  which incarnations of them, the run read;
* with Airflow's OpenLineage provider configured, each task instance's run event names its
  epoch and incarnation, the tables it wrote (at their Delta versions) and the committed tables
  it read (:mod:`falkirk.plugins.lineage`): a recovery's redo is a new run of the same job;
* it takes the store from the Airflow connection ``store_conn_id`` (default
  ``falkirk_default``, see :mod:`falkirk.plugins.store_hook`) when it is defined, so the
  credentials live in Airflow's connections and secrets backends rather than in the
  workers' environment.

``application`` is a job's file, or its module (``falkirk.spark_jobs.pipeline.aggregate``,
or a module of the team's own package): a DAG outside this repository runs the package's
jobs and its own alike.

Example (a DAG file)::

    aggregate = RegimeSparkSubmitOperator(
        task_id="aggregate",
        application="falkirk.spark_jobs.pipeline.aggregate",
        regime=EagerCheckpoint(),
        epoch_clock=CLOCK,
    )
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from falkirk.plugins.dags_test import DAGS_TEST_STORE_ENV, dags_test_store, is_dags_test, run_key
from falkirk.plugins.job_hook import FalkirkJobHook
from falkirk.plugins.store_hook import DEFAULT_CONN_ID, FalkirkStoreHook
from falkirk.plugins.task_metadata import (  # noqa: F401
    concurrent_inputs_of,
    epoch_clock_of,
    partition_outlets_of,
    partitions_of,  # (re-exported)
    regime_of,
)
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies.asset_events import CommittedEpoch, ConsumedEvent, epoch_partition_key, run_date
from falkirk.policies.epochs import EpochClock
from falkirk.policies.job_spec import REFUSED_EXIT_CODE, TAKEN_OVER_EXIT_CODE, JobSpec, first_try
from falkirk.policies.lineage import TableRead, parse_reads_line
from falkirk.policies.partitions import check_count
from falkirk.policies.regimes import Regime, RegimeError, Tier
from falkirk.policies.store import StoreConfig

# Small defaults for small epochs; any of them can be overridden through `conf`.
DEFAULT_SPARK_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}


DEFAULT_SPARK_CONN_ID = "spark_default"
DEFAULT_SPARK_CONN = {"conn_type": "spark", "host": "local[2]"}  # when spark_default is not defined


def mapping_refused(task_id: str, why: str) -> TypeError:
    """Why a Falkirk task cannot be mapped as asked: it is partitioned by ``.expand(partition=range(N))``
    and nothing else (mapped instances over other arguments would commit the same tables)."""
    return TypeError(
        f"task {task_id!r}: {why}. A Falkirk task is mapped only into partitions: "
        f".partial(task_id={task_id!r}, ...).expand(partition=range(N)) runs one task instance per partition, "
        f"each with its own state, outputs and ledger rows; its job reads the partition as ctx.partition")


class PartitionedPartial:
    """What :meth:`RegimeSparkSubmitOperator.partial` returns: call ``.expand(partition=range(N))``.

    It checks the expansion when the DAG file is parsed and records the partition count with
    the task's arguments, where the scheduler, the job and the API server all find it.
    """

    def __init__(self, inner: Any, task_id: str) -> None:
        self._inner = inner
        self._task_id = task_id

    def expand(self, **mapped: Any) -> Any:
        try:
            count = partition_count(self._task_id, mapped)
        except TypeError:
            self._inner._expand_called = True  # the DAG fails to import with this error, not a warning
            raise
        self._inner.kwargs["partitions"] = count
        replicas = self._inner.kwargs["regime"].replicas
        # Process pairs: replicas A and B of partition p are task instances 2p and 2p+1.
        return self._inner.expand(partition=[p for p in range(count) for _ in range(replicas)])

    def expand_kwargs(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise mapping_refused(self._task_id, ".expand_kwargs() maps over arguments decided at run time")


def partition_count(task_id: str, mapped: Mapping[str, Any]) -> int:
    """The partition count of ``.expand(partition=range(N))`` (or a list ``[0, ..., N-1]``).

    >>> partition_count("tally", {"partition": range(4)})
    4
    >>> partition_count("tally", {"conf": [{}, {}]})
    Traceback (most recent call last):
    ...
    TypeError: task 'tally': .expand(conf=...) maps over conf. A Falkirk task is mapped only into partitions: .partial(task_id='tally', ...).expand(partition=range(N)) runs one task instance per partition, each with its own state, outputs and ledger rows; its job reads the partition as ctx.partition
    """
    if set(mapped) != {"partition"}:
        names = ", ".join(f"{k}=..." for k in mapped)
        raise mapping_refused(task_id, f".expand({names}) maps over {', '.join(k for k in mapped if k != 'partition')}")
    value = mapped["partition"]
    values = list(value) if isinstance(value, (range, list, tuple)) else None
    if not values or values != list(range(len(values))):
        raise mapping_refused(task_id, f"partition={value!r:.60} is not a fixed count: give range(N) for N partitions")
    return check_count(task_id, len(values))


class RegimeSparkSubmitOperator(SparkSubmitOperator):
    """Run ``application`` for the epoch of the current DAG run, under ``regime``.

    ``.partial(...).expand(partition=range(N))`` partitions the task: N task instances, one
    per partition (see :mod:`falkirk.policies.partitions`).
    """

    ui_color = "#d8e9f0"
    _committed: CommittedEpoch | None = None  # on spark-submit: the job's commit record, read by _get_hook's hook
    _reads: tuple[TableRead, ...] = ()  # on spark-submit: the tables the job read, for lineage
    _spec: JobSpec | None = None  # the epoch this task instance runs, once execute has worked it out

    @classmethod
    def partial(cls, **kwargs: Any) -> PartitionedPartial:  # type: ignore[override]
        """The task's arguments, to be partitioned with ``.expand(partition=range(N))``."""
        task_id = str(kwargs.get("task_id", "?"))
        regime = kwargs.get("regime")
        if not isinstance(regime, Regime):
            raise RegimeError(f"task {task_id!r}: regime={regime!r} is not a Regime; use Ephemeral(), "
                              f"Batch(log_outputs=...), LazyCheckpoint(every=k) or EagerCheckpoint() from policies")
        if "partition" in kwargs or "partitions" in kwargs:
            raise mapping_refused(task_id, "partition= goes in .expand(partition=range(N)), not in .partial()")
        # Mapped tasks are not constructed when the DAG is parsed: what __init__ would default
        # for the scheduler goes in here.
        kwargs.setdefault("depends_on_past", regime.keeps_state)
        if regime.replicas > 1:
            kwargs["retries"] = 0  # a lost replica is taken over by its twin, never retried
        return PartitionedPartial(super().partial(**kwargs), task_id)

    def __init__(
        self,
        *,
        application: str,
        regime: Regime,
        epoch_clock: EpochClock | None = None,
        conf: Mapping[str, Any] | None = None,
        env_vars: Mapping[str, str] | None = None,
        store_conn_id: str = DEFAULT_CONN_ID,
        products: Sequence[str] = (),
        partition: int | None = None,
        partitions: int | None = None,
        deterministic: bool = True,
        concurrent_inputs: Sequence[str] = (),
        partition_outlets: bool = False,
        **kwargs: Any,
    ) -> None:
        task_id = kwargs.get("task_id", "?")
        if not isinstance(partition_outlets, bool):
            raise TypeError(f"task {task_id!r}: partition_outlets={partition_outlets!r}: give True or False")
        if (partition is None) != (partitions is None):
            raise mapping_refused(task_id, "partition= and partitions= come from .expand(partition=range(N)); "
                                           "do not give them by hand")
        if partitions is not None:
            check_count(task_id, partitions)
            if not isinstance(partition, int) or not 0 <= partition < partitions:
                raise mapping_refused(task_id, f"partition={partition!r} is not one of 0..{partitions - 1}")
        if isinstance(regime, Regime) and regime.replicas > 1:
            if partitions is None:
                raise RegimeError(f"task {task_id!r}: {regime.spec()} runs each partition twice: partition the task "
                                  f"with .partial(task_id={task_id!r}, ...).expand(partition=range(N))")
            # A lost replica is taken over by its twin, never retried: a retry would be a second
            # writer of the same replica (flux: retries=0 on replica tasks).
            kwargs["retries"] = 0
        if isinstance(products, str) or not all(isinstance(p, str) and p for p in products):
            raise TypeError(f"task {task_id!r}: products={products!r}: give a list of output names, "
                            f"e.g. products=[\"output\"]")
        if not isinstance(regime, Regime):
            raise RegimeError(
                f"task {task_id!r}: regime={regime!r} is not a Regime; use Ephemeral(), Batch(log_outputs=...), "
                "LazyCheckpoint(every=k) or EagerCheckpoint() from policies"
            )
        if not isinstance(deterministic, bool):
            raise TypeError(f"task {task_id!r}: deterministic={deterministic!r}: give True or False")
        if not deterministic and any(regime.output_tier(e) is not Tier.DURABLE for e in (1, 2, 3)):
            raise RegimeError(
                f"task {task_id!r}: deterministic=False with regime {regime.spec()}, which keeps its outputs in "
                f"scratch: a re-run would not reproduce them, so they are its determinants and must be logged. "
                f"Use Batch(log_outputs=True), LazyCheckpoint(every=k, log_outputs=True) or EagerCheckpoint()")
        if isinstance(concurrent_inputs, str) or not all(isinstance(t, str) and t for t in concurrent_inputs):
            raise TypeError(f"task {task_id!r}: concurrent_inputs={concurrent_inputs!r}: give a list of task ids, "
                            f"e.g. concurrent_inputs=[\"draw\"]")
        if epoch_clock is not None and not isinstance(epoch_clock, EpochClock):
            raise TypeError(f"task {task_id!r}: epoch_clock={epoch_clock!r} is not a falkirk.policies.EpochClock")
        application = job_file(application, task_id)
        # A task that keeps state builds epoch t on epoch t-1: its epochs run in order.
        kwargs.setdefault("depends_on_past", regime.keeps_state)
        super().__init__(
            application=application,
            conf={**DEFAULT_SPARK_CONF, **(conf or {})},
            env_vars={**_python_env(), **(env_vars or {})},
            **kwargs,
        )
        epoch_clock = _clock_of_dag(self, epoch_clock)
        for warning in replay_warnings(self, regime):
            warnings.warn(warning, FalkirkSettingsWarning, stacklevel=2)
        self.regime = regime
        self.epoch_clock = epoch_clock
        self.store_conn_id = store_conn_id
        self.products = tuple(products)
        self.partition = partition
        self.partitions = partitions
        self.deterministic = deterministic
        self.concurrent_inputs = tuple(concurrent_inputs)
        # Serialized for the scheduler's placement hook (it reads the DAG, not this object).
        self.falkirk_concurrent_inputs = ",".join(self.concurrent_inputs)
        # Off by default: Airflow starts no run of a DAG scheduled plainly on an Asset (not
        # partitioned) for an event that has a partition key.
        self.partition_outlets = partition_outlets
        # The regime's and the clock's text forms, serialized with the DAG: the API server reads
        # them from the serialized DAG without importing DAG files (see falkirk.plugins.task_metadata).
        self.falkirk_regime = regime.spec()
        self.falkirk_epoch_clock = epoch_clock.spec()

    @classmethod
    def get_serialized_fields(cls) -> frozenset[str]:
        return frozenset(super().get_serialized_fields() | {"falkirk_regime", "falkirk_epoch_clock",
                                                             "falkirk_concurrent_inputs", "partition_outlets"})

    def job_spec(self, context: Mapping[str, Any]) -> JobSpec:
        """The job's command line for this task instance."""
        dag_run = context["dag_run"]
        ti = context["ti"]
        map_index = ti.map_index if ti.map_index is not None else -1
        if self.partitions is not None and map_index // self.regime.replicas != self.partition:
            raise RuntimeError(f"{self.task_id}: task instance {map_index} runs partition {self.partition}; "
                               f"a Falkirk task is mapped only with .expand(partition=range(N))")
        dag = self._dag if self.has_dag() else None
        self._check_concurrent_inputs(dag)
        inputs = tuple(sorted(set(self.upstream_task_ids) | set(self.concurrent_inputs)))
        return JobSpec(
            dag_id=self.dag_id,
            task_id=self.task_id,
            epoch=self.epoch_clock.epoch_of(self._run_date(dag_run)),
            regime=self.regime,
            run_id=dag_run.run_id,
            try_number=ti.try_number,
            first_try=first_try(ti.try_number, getattr(ti, "max_tries", None), self.retries),
            map_index=map_index,
            inputs=inputs,
            products=self.products,
            partitions=self.partitions,
            input_partitions=tuple((t, n) for t in inputs
                                   if dag is not None and (n := partitions_of(dag.get_task(t))) is not None),
            deterministic=self.deterministic,
            replicas=self.regime.replicas,
            paired_inputs=tuple(t for t in inputs if dag is not None and (r := regime_of(dag.get_task(t))) is not None
                                and r.replicas > 1),
            consumed=consumed_events(context.get("triggering_asset_events")),
        )

    def _run_date(self, dag_run: Any) -> Any:
        """The date of the run's epoch: its logical date, or for a run started by asset events
        (which has none) the date of the partition it runs."""
        date = run_date(dag_run.logical_date, getattr(dag_run, "partition_date", None),
                        getattr(dag_run, "partition_key", None))
        if date is None:
            raise RuntimeError(
                f"{self.task_id}: DAG run {dag_run.run_id} has no logical date (Airflow starts a run on asset events "
                f"without one) and no epoch partition, so its epoch is unknown. Schedule {self.dag_id} with "
                f"PartitionedAssetTimetable(assets=...) on assets whose Falkirk producer task sets "
                f"partition_outlets=True: each run then has its producer epoch's date")
        return date

    def _check_concurrent_inputs(self, dag: Any) -> None:
        for t in self.concurrent_inputs:
            if dag is not None and not dag.has_task(t):
                raise ValueError(f"{self.task_id}: concurrent_inputs names {t!r}, which DAG {self.dag_id!r} does "
                                 f"not have; its tasks are {sorted(dag.task_ids)}")
            if t in self.upstream_task_ids or t in self.downstream_task_ids or t == self.task_id:
                raise ValueError(f"{self.task_id}: concurrent_inputs names {t!r}, which is also linked to it with "
                                 f">>: a concurrent input runs beside this task, so drop the Airflow edge")

    # Modules the job imports besides the runtime, imported once by a job host of their own.
    job_host_preload: tuple[str, ...] = ()

    def job_argv(self, spec: JobSpec) -> list[str]:
        """The job's command line: the spec, for a job file of its own."""
        return spec.argv()

    def job_env(self) -> dict[str, str]:
        """The job's environment: the operator's ``env_vars``, plus the store's connection
        (``falkirk_default`` if it is defined; without it the worker's ``FALKIRK_*`` variables)."""
        return {**(self.env_vars or {}), **FalkirkStoreHook(self.store_conn_id).store_env()}

    def execute(self, context: Any) -> None:
        spec = self._spec = dataclasses.replace(self.job_spec(context), task_instance=True)
        self.log.info("Falkirk: %s epoch %s under %s", spec.task_id, spec.epoch, spec.regime.spec())
        self.application_args = self.job_argv(spec)
        self.env_vars = self.job_env()
        # The store as the job will see it, read before Spark starts: a missing or wrong
        # configuration fails here, in the task's own error. The operator reads nothing from
        # the store: the job decides whether its epoch runs, is a no-op, or is refused.
        store = StoreConfig.from_env({**os.environ, **self.env_vars})
        if is_dags_test(context):
            store = dags_test_store(store, spec.dag_id, run_key(context["dag_run"]))
            self.env_vars = {**self.env_vars, **store.env()}
            self.log.info("Falkirk: `airflow dags test` run: using the store %s (%s=DIR keeps one from test to test, "
                          "=real uses the DAG's own). This run holds epoch %s's logical date in Airflow: delete it "
                          "before triggering the real epoch %s (falkirk discard --dag %s --epochs %s --yes)",
                          store.durable_uri, DAGS_TEST_STORE_ENV, spec.epoch, spec.epoch, spec.dag_id, spec.epoch)
        if self.name == "arrow-spark":  # the provider's default application name
            self.name = f"falkirk:{spec.dag_id}.{spec.task_id}:epoch-{spec.epoch}"
        conn = self._spark_connection()
        if conn.conn_type == "spark_connect":
            self._job_hook = FalkirkJobHook(self._conn_id, on_line=lambda line: self.log.info("%s", line))
            code = self._job_hook.run_connect(self.application, self.application_args, self.env_vars, self.conf,
                                              preload=self.job_host_preload)
            if code == REFUSED_EXIT_CODE:
                raise _refused(self._job_hook.refusal, spec)
            if code == TAKEN_OVER_EXIT_CODE:
                raise _taken_over(self._job_hook.refusal, spec)
            if code != 0:
                raise RuntimeError(f"{self.task_id}: the job exited with code {code}; its output is above")
            self._describe_asset_events(context, self._job_hook.committed)
            return
        try:
            super().execute(context)
        except Exception:
            submitted = getattr(getattr(self, "_hook", None), "_submit_sp", None)
            if submitted is not None and submitted.returncode == REFUSED_EXIT_CODE:
                raise _refused(None, spec) from None
            if submitted is not None and submitted.returncode == TAKEN_OVER_EXIT_CODE:
                raise _taken_over(None, spec) from None
            raise
        self._describe_asset_events(context, self._committed)

    def _get_hook(self) -> Any:
        """The provider's ``SparkSubmitHook``, its output lines also read for the job's commit record."""
        hook = super()._get_hook()
        self._committed = None  # the job's commit record, once its output shows it
        process_log = hook._process_spark_submit_log

        def watched(lines: Any) -> None:
            def each() -> Any:
                for line in lines:
                    self._committed = CommittedEpoch.parse_line(str(line).strip()) or self._committed
                    self._reads = parse_reads_line(str(line).strip()) or self._reads
                    yield line
            process_log(each())

        hook._process_spark_submit_log = watched  # type: ignore[method-assign, assignment]  # one hook's log
        return hook

    def _describe_asset_events(self, context: Any, committed: CommittedEpoch | None) -> None:
        """Put the commit in the ``extra`` of each asset event this task instance emits (its outlets)."""
        from airflow.sdk import Asset

        assets = [o for o in (self.outlets or []) if isinstance(o, Asset)]
        if not assets:
            return
        if committed is None:  # spark-submit in cluster deploy mode: the driver's output is not streamed here
            self.log.warning("Falkirk: the job's commit record was not in its output; the asset events of %s carry "
                             "no epoch or incarnation", ", ".join(a.name for a in assets))
            return
        key = epoch_partition_key(self.epoch_clock.logical_date(committed.epoch)) if self.partition_outlets else None
        for asset in assets:
            context["outlet_events"][asset].extra.update(committed.extra())
            if key is not None:
                context["outlet_events"][asset].add_partitions(key)
        self.log.info("Falkirk: asset events %s: %s epoch %s, incarnation %s%s", ", ".join(a.name for a in assets),
                      committed.processor, committed.epoch, committed.incarnation,
                      " (replaces the events of earlier incarnations)" if committed.replacement else "")

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The task instance's lineage, for Airflow's OpenLineage provider (which alone calls this):
        the epoch and incarnation it committed, the tables it read and wrote (:mod:`falkirk.plugins.lineage`)."""
        return self._lineage()

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """The failed task instance's lineage: its epoch, and the commit if its job made one before failing."""
        return self._lineage()

    def _lineage(self) -> Any:
        from falkirk.plugins.lineage import operator_lineage

        spec = self._spec
        if spec is None:  # execute failed before it knew the epoch
            return None
        job = getattr(self, "_job_hook", None)
        committed, reads = (job.committed, job.reads) if job is not None else (self._committed, self._reads)
        return operator_lineage(self.falkirk_regime, spec.dag_id, spec.task_id, spec.epoch, spec.map_index,
                                committed=committed, reads=reads)

    def _spark_connection(self) -> Any:
        """The Spark connection; ``spark_default`` runs on ``local[2]`` when it is not defined."""
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            return BaseHook.get_connection(self._conn_id)
        except AirflowNotFoundException:
            if self._conn_id != DEFAULT_SPARK_CONN_ID:
                raise
        self.log.info("Falkirk: connection %s is not defined; running on local[2]", DEFAULT_SPARK_CONN_ID)
        # Where the provider's hook looks the connection up (this task's process only).
        os.environ[f"AIRFLOW_CONN_{DEFAULT_SPARK_CONN_ID.upper()}"] = json.dumps(DEFAULT_SPARK_CONN)
        return BaseHook.get_connection(self._conn_id)

    def on_kill(self) -> None:
        job = getattr(self, "_job_hook", None)
        if job is not None:
            job.on_kill()
            return
        super().on_kill()


def consumed_events(triggering: Mapping[Any, Sequence[Any]] | None) -> tuple[ConsumedEvent, ...]:
    """The Falkirk commits among a run's triggering asset events (Airflow's
    ``context["triggering_asset_events"]``: asset -> its events), oldest first; events other
    tasks emitted carry none and are left out."""
    found = []
    for asset, events in (triggering or {}).items():
        for event in events:
            committed = CommittedEpoch.from_extra(event.extra)
            if committed is not None:
                found.append((event.timestamp, ConsumedEvent(asset.name, committed)))
    # An event reached through an asset alias is listed under the alias too: the job may read it
    # by either name (read_asset reads each producer epoch once).
    return tuple(dict.fromkeys(event for _, event in sorted(found, key=lambda item: item[0])))


def _refused(refusal: str | None, spec: JobSpec) -> Exception:
    """The task instance's failure, without retries, when its job refused a completed epoch."""
    from airflow.sdk.exceptions import AirflowFailException

    return AirflowFailException(refusal or "\n".join([
        f"{spec.processor} epoch {spec.epoch} already completed and no recovery has rolled it back (the job's "
        f"output above says more). To redo it, plan a recovery and replay it:",
        f"    falkirk plan --dag {spec.dag_id} --bad-epoch {spec.processor}:{spec.epoch}",
        "    falkirk replay PLAN_ID"]))


def _taken_over(said: str | None, spec: JobSpec) -> Exception:
    """A replica whose twin took over ends skipped: the partition's epoch is its twin's, so
    neither its readers nor the DAG run wait on it or count it as failed."""
    from airflow.sdk.exceptions import AirflowSkipException

    return AirflowSkipException(said or f"{spec.replica} epoch {spec.epoch}: taken over by its twin")


class FalkirkSettingsWarning(UserWarning):
    """A DAG setting under which a recovery cannot replay as planned (see :func:`replay_warnings`)."""


def _clock_of_dag(task: RegimeSparkSubmitOperator, clock: EpochClock | None) -> EpochClock:
    """The task's epoch clock: ``epoch_clock=``, or the clock of the DAG's :class:`EpochTimetable`
    (the two must agree when both are given)."""
    dag = getattr(task, "_dag", None)
    timetable = getattr(dag, "timetable", None)
    dag_clock = timetable.clock if isinstance(timetable, EpochTimetable) else None
    if isinstance(timetable, EpochTimetable) and dag is not None and timetable.dag_id != dag.dag_id:
        # Bound to the DAG (a copy: one timetable may serve several DAGs), so that a trigger
        # leaving a gap after the DAG's latest run is refused (EpochTimetable.latest_run_epoch).
        dag.timetable = timetable.for_dag(dag.dag_id)
    if clock is None and dag_clock is None:
        raise TypeError(f"task {task.task_id!r} needs an epoch clock: give the DAG "
                        f"schedule=EpochTimetable(clock) (falkirk.plugins.timetable), or the task epoch_clock=clock")
    if clock is not None and dag_clock is not None and clock != dag_clock:
        raise TypeError(f"task {task.task_id!r}: epoch_clock={clock.spec()} differs from the DAG's "
                        f"EpochTimetable clock {dag_clock.spec()}; give one clock (leave epoch_clock out)")
    return clock or dag_clock  # type: ignore[return-value]


def replay_warnings(task: Any, regime: Regime) -> list[str]:
    """DAG settings under which a recovery of ``task`` cannot replay as planned, one sentence each.

    A stateful task must run its epochs in order (``depends_on_past``), and Airflow must find the
    previous epoch among all the DAG's runs: with ``catchup=True`` and a timetable that schedules,
    ``depends_on_past`` looks only at the previous *scheduled* run and passes over manual ones.
    """
    found = []
    if regime.keeps_state and not task.depends_on_past:
        found.append(f"task {task.task_id!r} keeps state ({regime.spec()}) but depends_on_past=False: after a "
                     f"recovery Airflow may start its epochs out of order, and an epoch whose previous state is "
                     f"not there yet fails; leave depends_on_past at its default (True)")
    dag = getattr(task, "_dag", None)
    timetable = getattr(dag, "timetable", None)
    if (dag is not None and regime.keeps_state and getattr(dag, "catchup", False)
            and getattr(timetable, "can_be_scheduled", False)):
        found.append(f"task {task.task_id!r} keeps state and DAG {dag.dag_id!r} has catchup=True with a schedule: "
                     f"Airflow's depends_on_past then checks only the previous scheduled run and lets an epoch "
                     f"start before a manual or replayed previous epoch finished; set catchup=False (backfills "
                     f"still create past epochs)")
    return found


def job_file(application: str, task_id: str = "?") -> str:
    """The file of a job given as a path or as a module name.

    >>> job_file("falkirk.spark_jobs.pipeline.ingest").endswith("spark_jobs/pipeline/ingest.py")
    True
    >>> job_file("falkirk.spark_jobs.nope", "t")
    Traceback (most recent call last):
        ...
    FileNotFoundError: task 't': application 'falkirk.spark_jobs.nope' is neither a file nor an importable module
    """
    if Path(application).is_file():
        return str(application)
    origin = None
    if application.isidentifier() or all(part.isidentifier() for part in application.split(".")):
        try:
            spec = importlib.util.find_spec(application)
        except ImportError:  # a parent package that does not exist
            spec = None
        origin = spec.origin if spec is not None else None
    if origin is None or not origin.endswith(".py"):
        raise FileNotFoundError(f"task {task_id!r}: application {application!r} is neither a file nor an "
                                f"importable module")
    return origin


def _python_env() -> dict[str, str]:
    """Point spark-submit, the driver and local executors at the interpreter running Airflow.

    The project is installed into that interpreter's environment, so the job can import
    ``spark_jobs`` and ``policies``; ``spark-submit`` comes from the same environment.
    """
    env = {
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
    }
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join([bin_dir, path])
    return env
