"""sessions (ProcessPairs, 4 partitions by (src, dst)): open sessions; a closed one is emitted.

Partition ``p`` keeps the sessions of its (src, dst) pairs that have started and not ended (its
state). An END event closes one and emits ``(sn, app, src, dur)`` with the END's SN and
``dur = ts_end - ts_start``. Events are applied in SN order, so both replicas, and any re-run,
compute the same rows.
"""

from __future__ import annotations

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

STATE_SCHEMA = "src string, dst string, app string, ts_start long"
OUTPUT_SCHEMA = "sn long, app string, src string, dur long"
# Flux's fixture places its four (src, dst) pairs explicitly; any other pair by a stable hash.
PLACED = {("a", "x"): 0, ("b", "y"): 1, ("a", "z"): 2, ("c", "x"): 3}


def partition_of(src: str, dst: str, partitions: int) -> int:
    """The partition of a (src, dst) pair.

    >>> partition_of("b", "y", 4), partition_of("q", "r", 4)
    (1, 3)
    """
    placed = PLACED.get((src, dst))
    return placed % partitions if placed is not None else sum(map(ord, src + dst)) % partitions


def step(state: dict[tuple[str, str], tuple[str, int]], events: list[tuple]) -> list[tuple]:
    """Apply ``events`` (SN order) to the open sessions ``state`` in place; returns the closed ones.

    >>> state = {}
    >>> step(state, [(1, "a", "x", "START", "http", 0), (3, "a", "x", "END", None, 5)]), state
    ([(3, 'http', 'a', 5)], {})
    """
    out = []
    for sn, src, dst, kind, app, ts in events:
        if kind == "START":
            state[src, dst] = (app, ts)
        elif kind == "END" and (src, dst) in state:
            app0, start = state.pop((src, dst))
            out.append((sn, app0, src, ts - start))
    return out


def compute(ctx: EpochContext) -> EpochResult:
    mine = [r for r in ctx.read_input("ingress").collect()
            if partition_of(r["src"], r["dst"], ctx.partitions or 1) == (ctx.partition or 0)]
    previous = ctx.previous_state()
    state = {(r["src"], r["dst"]): (r["app"], r["ts_start"]) for r in (previous.collect() if previous else [])}
    closed = step(state, sorted((tuple(r) for r in mine), key=lambda e: e[0]))
    spark = ctx.spark
    return EpochResult(
        outputs={"output": spark.createDataFrame(closed, schema=OUTPUT_SCHEMA)},
        state=spark.createDataFrame(sorted((s, d, a, t) for (s, d), (a, t) in state.items()), schema=STATE_SCHEMA))


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
