"""Run a Falkirk DAG's jobs in this process, epoch by epoch, without Airflow: a failure-free
reference run to compare a recovered run with. Run it in a process of its own
(``python -m devstack.inprocess``) where a process already holds a Spark session of another
kind: each job stops its session when it ends.

Each task instance goes through the same runtime (:func:`falkirk.spark_jobs.runtime.run_job`) with
the command line the operator would build, in the DAG's task order, so the reference
commits the same tables and ledger rows a scheduler-driven run does. With ``SPARK_REMOTE``
set the jobs are Spark Connect clients of one server (seconds per job).
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from devstack.spark import SMALL_EPOCHS_SQL_CONF
from falkirk.policies.asset_events import CommittedEpoch, ConsumedEvent
from falkirk.policies.job_spec import TAKEN_OVER_EXIT_CODE, JobSpec
from falkirk.policies.regimes import Regime
from falkirk.policies.store import StoreConfig
from falkirk.spark_jobs.runtime import run_job


@contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_in_process(
    dag_id: str,
    package: str,
    regimes: Mapping[str, Regime],
    edges: Sequence[tuple[str, str]],
    epochs: Sequence[int],
    store: StoreConfig,
    env: Mapping[str, str] | None = None,
    progress: Callable[[str], None] = print,
    partitions: Mapping[str, int] | None = None,
    skip: Collection[str] = (),
    after_epoch: Callable[[int], None] | None = None,
    consumes: Mapping[str, tuple[str, str]] | None = None,
) -> float:
    """Run every task of ``dag_id`` (job modules ``{package}.{task}``) for ``epochs``, but the
    processors in ``skip``; returns seconds.

    ``consumes``: for a DAG scheduled on Airflow Assets, each asset's producer (DAG id, task):
    each epoch's run consumes that producer's commit of the same epoch, as the asset event one
    of its runs commits starts the run of the same partition key.

    A task in ``partitions`` runs once per partition (per replica of each partition, under
    process pairs), as its mapped task instances would. A replica the layout declared dead
    exits at once, as its task instance would end skipped: the run goes on. ``after_epoch`` is
    called with each epoch once all its task instances have committed."""
    counts = dict(partitions or {})
    started = time.monotonic()
    order = list(regimes)  # the caller lists tasks upstream first
    upstream = {t: tuple(sorted(u for u, d in edges if d == t)) for t in order}
    jobs = {t: importlib.import_module(f"{package}.{t}").compute for t in order}
    # Few shuffle partitions, no generated code, no adaptive re-planning: see devstack.spark.
    conf = {"FALKIRK_SPARK_CONF": ",".join(f"{k}={v}" for k, v in SMALL_EPOCHS_SQL_CONF.items())}
    with _environ({**conf, **store.env(), **(env or {})}):
        for epoch in epochs:
            for task in order:
                replicas = regimes[task].replicas
                for index in range(counts[task] * replicas) if task in counts else (-1,):
                    spec = JobSpec(dag_id=dag_id, task_id=task, epoch=epoch, regime=regimes[task], run_id=f"epoch-{epoch}", inputs=upstream[task],
                                   map_index=index, partitions=counts.get(task),
                                   input_partitions=tuple((u, counts[u]) for u in upstream[task] if u in counts),
                                   replicas=replicas,
                                   paired_inputs=tuple(u for u in upstream[task] if regimes[u].replicas > 1),
                                   consumed=tuple(ConsumedEvent(asset, CommittedEpoch(dag_id=d, task_id=t, epoch=epoch))
                                                  for asset, (d, t) in (consumes or {}).items()))
                    if spec.processor in skip:
                        continue
                    code = run_job(jobs[task], spec.argv())
                    if code == TAKEN_OVER_EXIT_CODE:
                        progress(f"  {spec.processor} epoch {epoch}: taken over by its twin, skipped")
                        continue
                    if code != 0:
                        raise RuntimeError(f"{dag_id}.{spec.processor} epoch {epoch} exited {code}")
            if after_epoch is not None:
                after_epoch(epoch)
            progress(f"  reference: epoch {epoch} done ({time.monotonic() - started:.0f}s)")
    return time.monotonic() - started


def run_reference_process(dag_file: str, dag_id: str, package: str, epochs: int, env: Mapping[str, str],
                          timeout: float = 1800, partitions: Mapping[str, int] | None = None,
                          regimes: Mapping[str, Regime] | None = None, first: int = 1,
                          skip: Sequence[str] = (), collect: bool = False,
                          consumes: Mapping[str, tuple[str, str]] | None = None) -> str:
    """:func:`main` in a process of its own (the caller may hold a Spark session of another kind),
    with ``env`` (the store's variables and ``SPARK_REMOTE``) added to this one's environment;
    epochs ``first``..``epochs``, but the processors in ``skip``; ``partitions`` and ``regimes``
    replace the DAG file's for the tasks they name; ``collect`` collects garbage after each epoch
    (:func:`retained_per_epoch` reads what it printed); ``consumes``: as :func:`run_in_process`'s.
    Returns what it printed."""
    import subprocess
    import sys

    extra = [f"--partitions={t}={n}" for t, n in (partitions or {}).items()]
    extra += [f"--regime={t}={r.spec()}" for t, r in (regimes or {}).items()]
    extra += [f"--first={first}", *(f"--skip={p}" for p in skip), *(["--collect"] if collect else [])]
    extra += [f"--consumes={asset}={d}.{t}" for asset, (d, t) in (consumes or {}).items()]
    done = subprocess.run([sys.executable, "-m", "devstack.inprocess", dag_file, dag_id, package, "--epochs",
                           str(epochs), *extra], env={**os.environ, **env}, cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the reference run of {dag_id} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    return done.stdout


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m devstack.inprocess DAG_FILE DAG_ID PACKAGE --epochs N``: a reference run of the
    DAG file's ``REGIMES`` and ``EDGES`` (and ``PARTITIONS``, if it has them) under ``DAG_ID``
    (store and Spark from the environment)."""
    import argparse
    import importlib.util

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0] if main.__doc__ else None)
    parser.add_argument("dag_file")
    parser.add_argument("dag_id")
    parser.add_argument("package", help="the job modules' package, e.g. falkirk.spark_jobs.figure1")
    parser.add_argument("--epochs", type=int, required=True, help="run epochs 1..N (from --first)")
    parser.add_argument("--first", type=int, default=1, help="the first epoch to run (default 1)")
    parser.add_argument("--skip", action="append", default=[], metavar="PROCESSOR",
                        help="a task instance (task, or task[i]) not to run (repeatable)")
    parser.add_argument("--partitions", action="append", default=[], metavar="TASK=N",
                        help="a task's partition count instead of the DAG file's (repeatable)")
    parser.add_argument("--regime", action="append", default=[], metavar="TASK=SPEC",
                        help="a task's regime instead of the DAG file's (repeatable)")
    parser.add_argument("--collect", action="store_true",
                        help="collect garbage after every epoch (as falkirk gc --retain-hours 0), then print "
                             "the epochs each task's output table still holds: 'retained after epoch N: {json}'")
    parser.add_argument("--consumes", action="append", default=[], metavar="ASSET=DAG_ID.TASK",
                        help="an Airflow Asset the DAG is scheduled on, and the producer task that updates it: each "
                             "epoch consumes that task's commit of the same epoch (repeatable)")
    args = parser.parse_args(argv)
    consumes = {}
    for item in args.consumes:
        asset, _, producer = item.rpartition("=")
        dag, _, task = producer.rpartition(".")
        if not (asset and dag and task):
            parser.error(f"--consumes {item!r}: write ASSET=DAG_ID.TASK, e.g. falkirk_orders.ranking=falkirk_orders.publish")
        consumes[asset] = (dag, task)
    spec = importlib.util.spec_from_file_location("falkirk_reference_dag", args.dag_file)
    if spec is None or spec.loader is None:
        parser.error(f"dag_file {args.dag_file!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    counts = {**getattr(module, "PARTITIONS", {}), **{t: int(n) for t, _, n in (a.partition("=") for a in
                                                                               args.partitions)}}
    regimes = {**module.REGIMES, **{t: Regime.parse(r) for t, _, r in (a.partition("=") for a in args.regime)}}
    epochs = range(args.first, args.epochs + 1)
    store = StoreConfig.from_env()
    seconds = run_in_process(args.dag_id, args.package, regimes, module.EDGES, epochs, store,
                             progress=lambda m: print(m, flush=True), partitions=counts, skip=set(args.skip),
                             after_epoch=(lambda e: _collect_and_show(store, args.dag_id, list(regimes), e))
                             if args.collect else None, consumes=consumes)
    print(f"reference: {len(epochs)} epochs in {seconds:.0f}s", flush=True)
    return 0


RETAINED = "retained after epoch "


def _collect_and_show(store: StoreConfig, dag_id: str, tasks: Sequence[str], epoch: int) -> None:
    import json

    from falkirk.policies.planning.collector import collect, live_partitions
    from falkirk.policies.regimes import Tier

    collect(store, dag_id, retain_hours=0)
    held = {t: sorted(live_partitions(store, store.table_uri(Tier.DURABLE, dag_id, t, "output"))) for t in tasks}
    print(f"{RETAINED}{epoch}: {json.dumps(held)}", flush=True)


def retained_per_epoch(printed: str) -> dict[int, dict[str, list[int]]]:
    """What ``--collect`` printed: per epoch, the epochs each task's output table held after it.

    >>> retained_per_epoch("x\\nretained after epoch 2: {\\"a\\": [2]}\\n")
    {2: {'a': [2]}}
    """
    import json

    found = {}
    for line in printed.splitlines():
        if line.startswith(RETAINED):
            epoch, _, held = line[len(RETAINED):].partition(": ")
            found[int(epoch)] = json.loads(held)
    return found


if __name__ == "__main__":
    raise SystemExit(main())
