"""deliver (LazyCheckpoint(every=2)): commit ``draw``'s rows exactly once to the SQL table
``samples`` and the Delta table ``delivered``, in transactions of at most
``FALKIRK_SAMPLED_CAPACITY`` rows, while ``draw`` runs (see :mod:`falkirk.spark_jobs.sampled`).

Its state is the running count and sum of the rows delivered. ``draw`` is its concurrent
input: no Airflow edge, the two task instances of a DAG run run side by side. The sink reads
the edge (:func:`~falkirk.spark_jobs.marker_edge.receive`), then waits for draw's epoch to
commit and reads its logged output, which it checks against what it delivered. What the
edge did not bring it delivers from that logged output, in transactions of the same bound:
all of it in a re-run of an epoch whose ``draw`` is committed (a recovery), which so
delivers exactly the rows first delivered.
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

    def committed() -> bool:
        return ctx.ledger.find(a.dag_id, PRODUCER, ctx.epoch) is not None

    if not committed():  # draw is running: take its rows as the markers allow
        receive(edge_tables(ctx.store, a.dag_id), ctx.epoch, CHUNKS, limit, commit, markers(), who=a.processor,
                finished=committed)
        wait_for_commit(ctx)
    logged = ctx.read_input(PRODUCER)  # draw's logged output: also records the input in the ledger row
    rows = {r["key"]: r for r in logged.toArrow().to_pylist()}
    wrong = sorted(k for k, v in delivered.items() if k not in rows or rows[k]["value"] != v)
    if wrong:
        raise JobError(f"{a.processor} epoch {ctx.epoch}: rows {wrong[:5]} were delivered from the edge but differ "
                       f"from {PRODUCER}'s logged output: committed before their determinants were saved")
    # Everything the edge did not bring (all of it, when draw had committed before this began):
    # vouched for by draw's commit, delivered in transactions of the same bound.
    rest = sorted(k for k in rows if k not in delivered)
    if rest:
        say(f"{a.processor} epoch {ctx.epoch}: {PRODUCER} is committed; delivering {len(rest)} rows of its logged "
            f"output")
    for start in range(0, len(rest), limit):
        commit([rows[k] for k in rest[start:start + limit]])
    clear(edge_tables(ctx.store, a.dag_id), ctx.epoch)  # delivered (and those before); a re-run reads the log
    dropped = targets.finish(ctx.epoch, delivery, set(delivered))
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
