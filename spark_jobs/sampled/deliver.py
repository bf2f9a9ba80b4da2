"""deliver (LazyCheckpoint(every=2)): commit ``draw``'s rows exactly once to the SQL table
``samples`` and the Delta table ``delivered``, in transactions of at most
``FALKIRK_SAMPLED_CAPACITY`` rows, while ``draw`` runs (see :mod:`falkirk.spark_jobs.sampled`).

Its state is the running count and sum of the rows delivered. ``draw`` is its concurrent
input: no Airflow edge, the two task instances of a DAG run run side by side. The sink reads
the edge (:func:`~falkirk.spark_jobs.marker_edge.receive`), then waits for draw's epoch to
commit and reads its logged output, which it checks against what it delivered. A re-run of
an epoch whose ``draw`` is committed (a recovery) delivers that logged output instead: the
rows first delivered, in transactions of the same bound.
"""

from __future__ import annotations

import time

from pyspark.sql import functions as F

from falkirk.policies.regimes import Tier
from falkirk.spark_jobs.job_log import say
from falkirk.spark_jobs.marker_edge import WAIT_SECONDS, clear, receive
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, JobError, Sent, run_job
from falkirk.spark_jobs.sampled import CHUNKS, PRODUCER, capacity, edge_tables, markers
from falkirk.spark_jobs.sampled.targets import SampleTable, SampleTargets


def targets_of(ctx: EpochContext) -> SampleTargets:
    a = ctx.args
    return SampleTargets(SampleTable.for_dag(ctx.store.durable_uri, a.dag_id),
                         ctx.store.table_uri(Tier.DURABLE, a.dag_id, a.task_id, "delivered"))


def compute(ctx: EpochContext) -> EpochResult:
    a, limit = ctx.args, capacity()
    targets = targets_of(ctx)
    delivery = f"{a.incarnation}.{a.try_number}"
    delivered: dict[str, int] = {}

    def commit(rows: list[dict]) -> None:
        targets.commit(ctx.epoch, delivery, rows)
        delivered.update((r["key"], r["value"]) for r in rows)

    streamed = ctx.ledger.find(a.dag_id, PRODUCER, ctx.epoch) is None
    if streamed:  # draw is running: take its rows as the markers allow
        receive(edge_tables(ctx.store, a.dag_id), ctx.epoch, CHUNKS, limit, commit, markers(), who=a.processor)
        wait_for_commit(ctx)
    logged = ctx.read_input(PRODUCER)  # draw's logged output: also records the input in the ledger row
    rows = logged.toArrow().to_pylist()
    if streamed:
        if delivered != {r["key"]: r["value"] for r in rows}:
            raise JobError(f"{a.processor} epoch {ctx.epoch}: the rows delivered from the edge differ from "
                           f"{PRODUCER}'s logged output: a row was committed that its determinants do not vouch for")
        clear(edge_tables(ctx.store, a.dag_id), ctx.epoch)  # delivered; a re-run reads the logged output
    else:  # a re-run: everything is vouched for already
        say(f"{a.processor} epoch {ctx.epoch}: {PRODUCER} is committed; delivering its logged output")
        by_key = {r["key"]: r for r in rows}
        ordered = sorted(by_key)
        for start in range(0, len(ordered), limit):
            commit([by_key[k] for k in ordered[start:start + limit]])
    dropped = targets.finish(ctx.epoch, set(delivered))
    say(f"{a.processor} epoch {ctx.epoch}: {len(delivered)} rows delivered"
        + (f"; {dropped} rows of an earlier delivery dropped" if dropped else ""))
    totals = logged.agg(F.count("*").cast("long").alias("rows"), F.coalesce(F.sum("value"), F.lit(0)).cast("long")
                        .alias("total"))
    previous = ctx.previous_state()
    state = totals if previous is None else previous.unionByName(totals).agg(
        F.sum("rows").cast("long").alias("rows"), F.sum("total").cast("long").alias("total"))
    sent = len(delivered)
    # Both targets committed each batch in their own transactions: accepted as sent.
    return EpochResult(state=state, sent={"samples": Sent(f"sql:{targets.sql.schema}.samples", sent, accepted=True),
                                          "delivered": Sent(targets.delta_uri, sent, accepted=True)})


def wait_for_commit(ctx: EpochContext) -> None:
    """Wait for draw's ledger row of this epoch: written once its last chunk is saved."""
    deadline = time.monotonic() + WAIT_SECONDS
    while ctx.ledger.find(ctx.args.dag_id, PRODUCER, ctx.epoch) is None:
        if time.monotonic() > deadline:
            raise JobError(f"{ctx.args.processor} epoch {ctx.epoch}: {PRODUCER} announced its last chunk but has not "
                           f"committed epoch {ctx.epoch} after {WAIT_SECONDS:.0f} s")
        time.sleep(0.5)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
