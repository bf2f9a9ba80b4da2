"""The sampled-rows application: a non-deterministic producer and an exactly-once sink that
run side by side inside each epoch, joined by an edge with marker pairs
(:mod:`falkirk.spark_jobs.marker_edge`; ``dags/falkirk_sampled.py``).

* ``draw`` samples the epoch's keys (Spark's ``sample`` and ``rand``, no seed: a re-run draws
  other rows) in ``CHUNKS`` chunks. Each chunk's rows go in band to the edge as soon as they
  are drawn; then the chunk is checkpointed (``ctx.chunks``: the log of the task's
  determinants, durable because the task is declared ``deterministic=False``), and only then
  announced with a marker pair. Its epoch's output is logged, so a recovery reads it back
  instead of drawing again.
* ``deliver`` commits the rows to a SQL table (``samples`` in ``FALKIRK_QUERY_DB``) and a
  Delta table (``delivered``) in transactions of at most ``FALKIRK_SAMPLED_CAPACITY`` rows,
  each as soon as the markers allow, while ``draw`` still runs.

Settings (environment, set by the DAG): ``FALKIRK_SAMPLED_MARKERS`` (``pairs``, or ``slow``:
slow travellers only) and ``FALKIRK_SAMPLED_CAPACITY`` (rows per transaction, default 8).
"""

from __future__ import annotations

import os

from falkirk.policies.regimes import Tier
from falkirk.policies.store import StoreConfig
from falkirk.spark_jobs.marker_edge import EdgeTables, Markers

CHUNKS = 4
KEYS_PER_CHUNK = 40
PRODUCER = "draw"


def edge_tables(store: StoreConfig, dag_id: str) -> EdgeTables:
    """The edge from ``draw`` to ``deliver``: in scratch beside draw's tables (it only carries
    an epoch while it runs; the logged output outlives it)."""
    return EdgeTables(store.table_uri(Tier.SCRATCH, dag_id, PRODUCER, "edge"),
                      store.table_uri(Tier.SCRATCH, dag_id, PRODUCER, "edge-control"))


def markers() -> Markers:
    value = os.environ.get("FALKIRK_SAMPLED_MARKERS", "pairs")
    if value == "pairs":
        return "pairs"
    if value == "slow":
        return "slow"
    raise ValueError(f"FALKIRK_SAMPLED_MARKERS={value!r}: 'pairs' (marker pairs) or 'slow' (slow travellers only)")


def capacity() -> int:
    value = os.environ.get("FALKIRK_SAMPLED_CAPACITY", "8")
    if not value.isdigit() or int(value) < 2:
        raise ValueError(f"FALKIRK_SAMPLED_CAPACITY={value!r}: the largest transaction in rows, a whole number >= 2")
    return int(value)
