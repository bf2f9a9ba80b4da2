"""events (Batch, logged; one task instance per source partition): the epoch's purchases.

Partition ``p`` of epoch ``e`` holds twelve purchases, the same on every run: a user and an
amount, spread over the users so that every partition of ``totals`` gets some.
"""

from __future__ import annotations

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

SCHEMA = "user string, amount long"
PER_PARTITION = 12


def purchases(epoch: int, partition: int) -> list[tuple[str, int]]:
    """The purchases of one source partition in one epoch.

    >>> purchases(1, 0)[:3]
    [('u07', 32), ('u00', 45), ('u03', 8)]
    """
    return [(f"u{(epoch * 7 + partition * 5 + i * 3) % 10:02d}", (epoch * 31 + partition * 17 + i * 13) % 50 + 1)
            for i in range(PER_PARTITION)]


def compute(ctx: EpochContext) -> EpochResult:
    rows = purchases(ctx.epoch, ctx.partition or 0)
    return EpochResult(outputs={"output": ctx.spark.createDataFrame(rows, schema=SCHEMA)})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
