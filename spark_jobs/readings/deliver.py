"""deliver (Ephemeral, external output): sends tally's totals to the outbox.

It keeps no state and writes no table: the epoch's records go to a system outside the store,
and the epoch counts as a checkpoint once that system has accepted them (Falkirk Wheel §4.3). Before
sending, it reports what the outbox has accepted so far, so deliveries reach the ledger at
the latest with the next epoch; the monitor (or ``falkirk delivered``) can report sooner.
"""

from __future__ import annotations

from falkirk.spark_jobs.outbox import Outbox, report_deliveries
from falkirk.spark_jobs.readings import OUTBOX_ENV, location
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job


def outbox(ctx: EpochContext) -> Outbox:
    return Outbox(location(OUTBOX_ENV, ctx.store.durable_uri, ctx.args.dag_id, "outbox"))


def compute(ctx: EpochContext) -> EpochResult:
    box = outbox(ctx)
    report_deliveries(ctx.ledger, ctx.args.dag_id, ctx.args.task_id, box)
    rows = [{"epoch": ctx.epoch, **r.asDict()} for r in ctx.read_input("tally").orderBy("meter").collect()]
    return EpochResult(sent={"delivered": box.send(ctx.epoch, rows)})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
