"""stats (ProcessPairs, 4 partitions by (app, src)): running count, sum and maximum of session
durations; every update emits ``(sn, app, src, max, avg)`` to the sink.

Each partition reads every partition of ``sessions`` (each from one replica: its own replica id
first, its twin's once that one is declared dead), keeps its (app, src) pairs' running
statistics as its state, and applies the sessions in SN order. Both replicas write the sink;
the first commit of an epoch's partition wins.
"""

from __future__ import annotations

from falkirk.policies.partitions import Broadcast
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

STATE_SCHEMA = "app string, src string, cnt long, total long, longest long"
OUTPUT_SCHEMA = "sn long, app string, src string, longest long, avg double"
PLACED = {("http", "a"): 1, ("ftp", "b"): 2, ("http", "c"): 3}


def partition_of(app: str, src: str, partitions: int) -> int:
    """The partition of an (app, src) pair (partition 0 of the fixture gets none).

    >>> partition_of("ftp", "b", 4)
    2
    """
    placed = PLACED.get((app, src))
    return placed % partitions if placed is not None else sum(map(ord, app + src)) % partitions


def step(state: dict[tuple[str, str], tuple[int, int, int]], sessions: list[tuple]) -> list[tuple]:
    """Fold ``sessions`` ``(sn, app, src, dur)`` (SN order) into ``state``; one update row each.

    >>> state = {("http", "a"): (2, 8, 5)}
    >>> step(state, [(10, "http", "a", 7)]), state
    ([(10, 'http', 'a', 7, 5.0)], {('http', 'a'): (3, 15, 7)})
    """
    out = []
    for sn, app, src, dur in sessions:
        cnt, total, longest = state.get((app, src), (0, 0, 0))
        cnt, total, longest = cnt + 1, total + dur, max(longest, dur)
        state[app, src] = (cnt, total, longest)
        out.append((sn, app, src, longest, total / cnt))
    return out


def compute(ctx: EpochContext) -> EpochResult:
    rows = [tuple(r) for r in ctx.read_input("sessions", routing=Broadcast()).collect()
            if partition_of(r["app"], r["src"], ctx.partitions or 1) == (ctx.partition or 0)]
    previous = ctx.previous_state()
    state = {(r["app"], r["src"]): (r["cnt"], r["total"], r["longest"]) for r in (previous.collect() if previous else [])}
    updates = step(state, sorted(rows, key=lambda e: e[0]))
    spark = ctx.spark
    emitted = spark.createDataFrame(updates, schema=OUTPUT_SCHEMA)
    return EpochResult(
        outputs={"output": emitted}, sink=emitted,
        state=spark.createDataFrame(sorted((a, s, *v) for (a, s), v in state.items()), schema=STATE_SCHEMA))


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
