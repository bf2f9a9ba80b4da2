"""ingress (Batch, logged): the epoch's connection events, each with its sequence number (SN).

The fixture of Flux's running example: two sessions close in epoch 1 ((a,x) and (b,y), then
(a,z)), two in epoch 2 ((c,x), then (a,x) again); later epochs bring no events. Every run
produces the same rows, so both replicas downstream see the same input.
"""

from __future__ import annotations

import os

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

SCHEMA = "sn long, src string, dst string, kind string, app string, ts long"
EVENTS = {
    1: [(1, "a", "x", "START", "http", 0), (2, "b", "y", "START", "ftp", 1), (3, "a", "x", "END", None, 5),
        (4, "a", "z", "START", "http", 6), (5, "b", "y", "END", None, 9), (6, "a", "z", "END", None, 9)],
    2: [(7, "c", "x", "START", "http", 10), (8, "a", "x", "START", "http", 11), (9, "c", "x", "END", None, 14),
        (10, "a", "x", "END", None, 18)],
}


# Events per epoch of a synthetic stream instead of the fixture (the benchmark's load): one
# session opened and closed per two events, over KEYS (src, dst) pairs and ten applications.
SYNTHETIC_ENV = "FALKIRK_PAIRS_EVENTS"
KEYS = 1000


def events(epoch: int, synthetic: int = 0) -> list[tuple]:
    """The events of one epoch, in SN order: the fixture's, or ``synthetic`` numbered ones.

    >>> [e[0] for e in events(2)], events(3)
    ([7, 8, 9, 10], [])
    >>> events(2, synthetic=4)
    [(5, 's2', 'd0', 'START', 'app2', 5), (6, 's2', 'd0', 'END', None, 8), (7, 's3', 'd0', 'START', 'app3', 7), (8, 's3', 'd0', 'END', None, 11)]
    """
    if not synthetic:
        return list(EVENTS.get(epoch, []))
    out, base = [], (epoch - 1) * synthetic
    for j in range(synthetic // 2):
        k = (base // 2 + j) % KEYS
        src, dst, app = f"s{k % 200}", f"d{k // 200}", f"app{k % 10}"
        sn = base + 2 * j + 1
        out += [(sn, src, dst, "START", app, sn), (sn + 1, src, dst, "END", None, sn + 1 + k % 7)]
    return out


def compute(ctx: EpochContext) -> EpochResult:
    rows = events(ctx.epoch, int(os.environ.get(SYNTHETIC_ENV, "0") or 0))
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
