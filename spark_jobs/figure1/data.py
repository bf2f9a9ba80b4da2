"""Deterministic synthetic inputs, generated from a seed inside Spark (no driver-side data).

Per epoch: a clickstream of user-item events (``FALKIRK_RECORDS``, 40,000 by default;
millions work the same way) and a small batch of user queries (``QUERIES_PER_EPOCH``).
Every column is a function of (seed, epoch, row number) through ``xxhash64``, so any
epoch can be generated again, by any worker, with identical rows: that is what lets the
ephemeral region keep nothing durable.

Items are skewed (a few are popular); about 5% of events are from bots and some are too
short to count, which the ephemeral region filters out.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SEED = int(os.environ.get("FALKIRK_SEED", "4"))
RECORDS_ENV = "FALKIRK_RECORDS"
DEFAULT_RECORDS = 40_000
USERS = 2_000
ITEMS = 500
QUERIES_PER_EPOCH = 200


def records_per_epoch() -> int:
    value = os.environ.get(RECORDS_ENV, str(DEFAULT_RECORDS))
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{RECORDS_ENV}={value!r} is not a whole number; unset it or give e.g. 40000") from None
    if n < 1:
        raise ValueError(f"{RECORDS_ENV}={n} must be at least 1")
    return n


def _uniform(F, epoch: int, salt: str):
    """A deterministic number in [0, 1) per row."""
    h = F.xxhash64(F.lit(SEED), F.lit(epoch), F.col("id"), F.lit(salt))
    return (F.pmod(h, F.lit(1_000_003)) / F.lit(1_000_003.0))


def clickstream(spark: SparkSession, epoch: int, records: int | None = None) -> DataFrame:
    """Epoch ``epoch``'s raw events: event_id, user, item, kind ('click', 'view', 'bot'), dwell_ms."""
    from pyspark.sql import functions as F

    n = records or records_per_epoch()
    base = spark.range(n)
    kind = F.when(_uniform(F, epoch, "bot") < 0.05, "bot").when(_uniform(F, epoch, "kind") < 0.6, "click") \
        .otherwise("view")
    return base.select(
        (F.lit(epoch) * F.lit(10_000_000_000) + F.col("id")).alias("event_id"),
        F.floor(_uniform(F, epoch, "user") * USERS).cast("long").alias("user"),
        # squaring a uniform skews towards small ids: item 0 is the most popular
        F.floor(F.pow(_uniform(F, epoch, "item"), 2) * ITEMS).cast("long").alias("item"),
        kind.alias("kind"),
        F.floor(_uniform(F, epoch, "dwell") * 30_000).cast("long").alias("dwell_ms"),
    )


def queries(spark: SparkSession, epoch: int) -> DataFrame:
    """Epoch ``epoch``'s user queries: query_id, user, item (the item the user asks about)."""
    from pyspark.sql import functions as F

    return spark.range(QUERIES_PER_EPOCH).select(
        (F.lit(epoch) * F.lit(1_000_000) + F.col("id")).alias("query_id"),
        F.floor(_uniform(F, epoch, "q-user") * USERS).cast("long").alias("user"),
        F.floor(F.pow(_uniform(F, epoch, "q-item"), 2) * ITEMS).cast("long").alias("item"),
    )
