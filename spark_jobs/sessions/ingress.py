"""ingress (Batch, logged): the epoch's connection events, each with its sequence number (SN).

The fixture of Flux's running example: two sessions close in epoch 1 ((a,x) and (b,y), then
(a,z)), two in epoch 2 ((c,x), then (a,x) again); later epochs bring no events. Every run
produces the same rows, so both replicas downstream see the same input.
"""

from __future__ import annotations

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

SCHEMA = "sn long, src string, dst string, kind string, app string, ts long"
EVENTS = {
    1: [(1, "a", "x", "START", "http", 0), (2, "b", "y", "START", "ftp", 1), (3, "a", "x", "END", None, 5),
        (4, "a", "z", "START", "http", 6), (5, "b", "y", "END", None, 9), (6, "a", "z", "END", None, 9)],
    2: [(7, "c", "x", "START", "http", 10), (8, "a", "x", "START", "http", 11), (9, "c", "x", "END", None, 14),
        (10, "a", "x", "END", None, 18)],
}


def events(epoch: int) -> list[tuple]:
    """The events of one epoch, in SN order.

    >>> [e[0] for e in events(2)], events(3)
    ([7, 8, 9, 10], [])
    """
    return list(EVENTS.get(epoch, []))


def compute(ctx: EpochContext) -> EpochResult:
    rows = events(ctx.epoch)
    output = ctx.spark.createDataFrame(rows, schema=SCHEMA)
    if not ctx.args.regime.keeps_state:
        return EpochResult(outputs={"output": output})
    # Under a checkpointing regime it also counts the events it has ingested (its state).
    previous = ctx.previous_state()
    seen = previous.collect()[0]["events"] if previous is not None else 0
    return EpochResult(outputs={"output": output},
                       state=ctx.spark.createDataFrame([(seen + len(rows),)], schema="events long"))


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
