"""intake (Ephemeral): this epoch's readings from the inbox, invalid ones dropped.

Nothing durable: after a loss the epoch is read again from the inbox, which keeps it until
it is acknowledged (:mod:`falkirk.spark_jobs.inbox`). Each run first acknowledges what the low-
watermarks allow, so the inbox shrinks with the pipeline even without the maintenance DAG;
the monitor (:func:`falkirk.policies.planning.collector.collect` with ``acknowledge=``) can do it sooner.
"""

from __future__ import annotations

from falkirk.policies.ids import ProcessorId
from falkirk.policies.planning.monitor import acknowledged_inputs
from falkirk.policies.store.readability import StoreReadability, durable_only
from falkirk.spark_jobs.inbox import Inbox
from falkirk.spark_jobs.readings import GRAPH, INBOX_ENV, location
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

SCHEMA = "reading_id long, meter string, kwh long"


def inbox(ctx: EpochContext) -> Inbox:
    return Inbox(location(INBOX_ENV, ctx.store.durable_uri, ctx.args.dag_id, "inbox"))


def compute(ctx: EpochContext) -> EpochResult:
    box = inbox(ctx)
    readable = durable_only(StoreReadability(ctx.store), ctx.store.scratch_uri)
    box.acknowledge(acknowledged_inputs(ctx.ledger.entries(ctx.args.dag_id), readable, GRAPH)[ProcessorId(task="intake")])
    rows = box.read(ctx.epoch)
    frame = ctx.spark.createDataFrame(rows, schema=SCHEMA) if rows else ctx.spark.createDataFrame([], SCHEMA)
    return EpochResult(outputs={"output": frame.where("kwh > 0").select("meter", "kwh")})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
