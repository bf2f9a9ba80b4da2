"""A loop between two processors inside each epoch, on Spark: Falkirk Wheel Figure 7(c).

::

    s --e1--> p --e2 (ingress)--> q --e3 (egress)--> r
                                  q --e4--> y
                                  q <--e5 (feedback)-- y

s and p produce an epoch's input; q and y then pass it back and forth ITERATIONS times
inside the epoch, at lex times (epoch, iteration); q hands the epoch's result to r. A message
y sends at (t, c) is an event at (t, c + 1) for q (the feedback edge's +1), and q's result at
(t, ITERATIONS) leaves the loop as epoch t.

Every processor is a process of its own (a Spark client; its arithmetic runs on Spark), and
every edge a Delta table of messages keyed by the sender's time, one commit per time. Their
fault-tolerance regimes are the figure's:

* q checkpoints after every event (durable) and **logs** e3 and e4: the rows it sent stay in
  their tables, so a rolled-back receiver is fed from them (Q′) instead of q resending;
* y checkpoints **lazily**, after every odd iteration, to the scratch tier, and **discards**:
  what it sent on e5 is not kept for replay;
* s, p and r are epoch processors that checkpoint every epoch.

Each checkpoint is recorded with its Ξ (:class:`~falkirk.policies.rollback.records.XiRecord`)
in the processor's own records table. After a failure :func:`plan` assembles the records into
a scenario and the solver picks every processor's frontier; :func:`roll_back` deletes what
lies beyond them (checkpoints, state, sent messages, records), and the processors restart
from their frontiers (``--resume``). y dying at (1, 5) with checkpoints at (1, 1) and (1, 3)
is Figure 7(c): q goes back to (1, 4) (it consumed y's (1, 4) message, which y will send
again), y to (1, 3), r keeps going, and y's first message after the restart is q's logged
one at (1, 4).

Run a processor with ``python -m falkirk.spark_jobs.loops.cycle ROLE --store DIR --scratch DIR``
(``SPARK_REMOTE`` set to a Spark Connect server, or a local session): ROLE ``source`` and
``prepare`` and ``report`` take ``--epoch``; ``head`` (q) and ``body`` (y) take ``--epochs
FIRST-LAST`` and ``--resume EPOCH,ITERATION``. Local directories only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from falkirk.policies.rollback.records import TOP, XiRecord, rollback_times, scenario_from_records
from falkirk.policies.store.commits import open_table
from falkirk.spark_jobs import channels
from falkirk.spark_jobs.faults import crash_point
from falkirk.spark_jobs.job_log import say

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ITERATIONS = 8
NODES = 6
MODULUS = 1_000_003

PROCESSORS = {"s": "epoch", "p": "epoch", "q": "lex", "y": "lex", "r": "epoch"}
EDGES = [
    {"id": "e1", "src": "s", "dst": "p", "phi": "identity"},
    {"id": "e2", "src": "p", "dst": "q", "phi": "ingress"},
    {"id": "e3", "src": "q", "dst": "r", "phi": "egress"},
    {"id": "e4", "src": "q", "dst": "y", "phi": "identity"},
    {"id": "e5", "src": "y", "dst": "q", "phi": "feedback"},
]
MESSAGES = pa.schema([("epoch", pa.int64()), ("iteration", pa.int64()), ("node", pa.int64()), ("value", pa.int64())])
RECORDS = pa.schema([("epoch", pa.int64()), ("iteration", pa.int64()), ("kind", pa.string()), ("xi", pa.string())])
Time = tuple[int, int]


@dataclass(frozen=True)
class Layout:
    """Where the loop's tables live: durable ones under ``store``, y's under ``scratch``."""

    store: str
    scratch: str

    def table(self, name: str) -> str:
        root = self.scratch if name in ("e5", "state-y") else self.store
        return os.path.join(root, "cycle", name)

    def owned(self, pid: str) -> list[str]:
        """The tables only ``pid`` writes: what it sent, its state, its records."""
        sent = {"s": ["e1"], "p": ["e2"], "q": ["e3", "e4", "state-q"], "y": ["e5", "state-y"], "r": ["report"]}[pid]
        return [self.table(n) for n in sent + [f"records-{pid}"]]


# -- one commit per time ----------------------------------------------------------------------------------

def put(uri: str, at: Time, rows: pa.Table) -> None:
    """Replace the rows at time ``at`` with ``rows`` in one commit (so a repeat changes nothing)."""
    channels.replace(uri, rows, epoch=at[0], iteration=at[1])


def get(uri: str, at: Time) -> pa.Table | None:
    """The rows at time ``at``, or ``None`` while none are committed."""
    return channels.read(uri, epoch=at[0], iteration=at[1])


def wait_for(uri: str, at: Time, who: str) -> pa.Table:
    """The rows at ``at`` once their commit lands (a channel's receiver polls its table)."""
    return channels.wait_for(uri, who, epoch=at[0], iteration=at[1])


def messages(at: Time, frame: DataFrame) -> pa.Table:
    """A frame of (node, value) as the message rows at time ``at``."""
    rows = frame.toArrow().sort_by("node")
    n = rows.num_rows
    return pa.table([pa.array([at[0]] * n, pa.int64()), pa.array([at[1]] * n, pa.int64()),
                     rows["node"].cast(pa.int64()), rows["value"].cast(pa.int64())], schema=MESSAGES)


def record(layout: Layout, pid: str, at: Time | None, xi: XiRecord) -> None:
    """Record Ξ of a checkpoint at ``at`` (or of ⊤ when ``at`` is None, one row kept)."""
    uri = layout.table(f"records-{pid}")
    body = json.dumps({"M": xi.M, "N": xi.N, "D": xi.D})
    kind = "live" if at is None else "checkpoint"
    epoch, iteration = at if at is not None else (-1, -1)
    rows = pa.table([pa.array([epoch], pa.int64()), pa.array([iteration], pa.int64()),
                     pa.array([kind]), pa.array([body])], schema=RECORDS)
    if at is None:
        channels.replace(uri, rows, kind="live")
    else:
        channels.replace(uri, rows, kind="checkpoint", epoch=epoch, iteration=iteration)


def records(layout: Layout) -> list[XiRecord]:
    """Every processor's records."""
    found = []
    for pid, domain in PROCESSORS.items():
        for r in channels.rows(layout.table(f"records-{pid}")):
            xi = json.loads(r["xi"])
            at = None if r["kind"] == "live" else ((r["epoch"], r["iteration"]) if domain == "lex" else r["epoch"])
            found.append(XiRecord(pid, at, xi["M"], xi["N"], xi["D"]))
    return found


def through(at: Any) -> dict[str, Any]:
    return {"through": list(at) if isinstance(at, tuple) else at}


# -- the processors ---------------------------------------------------------------------------------------

def frame(spark: SparkSession, rows: pa.Table) -> DataFrame:
    return spark.createDataFrame(rows.select(["node", "value"]).to_pandas())


def source(spark: SparkSession, layout: Layout, epoch: int) -> None:
    """s: epoch ``epoch`` of the external input (the same rows every time it is read)."""
    from pyspark.sql import functions as F

    rows = spark.range(NODES).select(F.col("id").alias("node"),
                                     ((F.lit(epoch * 7 + 1) + F.col("id") * 13) % MODULUS).alias("value"))
    put(layout.table("e1"), (epoch, 0), messages((epoch, 0), rows))
    record(layout, "s", (epoch, 0), XiRecord("s", epoch, N="empty", D={"e1": through(epoch)}))


def prepare(spark: SparkSession, layout: Layout, epoch: int) -> None:
    """p: s's epoch, transformed, sent into the loop (the ingress: epoch t enters at (t, 0))."""
    from pyspark.sql import functions as F

    rows = frame(spark, wait_for(layout.table("e1"), (epoch, 0), "p"))
    out = rows.select("node", ((F.col("value") * 2 + epoch) % MODULUS).alias("value"))
    put(layout.table("e2"), (epoch, 0), messages((epoch, 0), out))
    record(layout, "p", (epoch, 0), XiRecord("p", epoch, M={"e1": through(epoch)}, N="empty",
                                             D={"e2": through((epoch, 0))}))


def head(spark: SparkSession, layout: Layout, epochs: range, resume: Time | None) -> None:
    """q: at (t, 0) the epoch's input plus the previous epoch's result goes to y; at (t, c) y's
    reply of (t, c - 1) is transformed and goes back, until (t, ITERATIONS) leaves as epoch t."""
    from pyspark.sql import functions as F

    x = None
    if resume is not None:
        x = frame(spark, _state(layout, "state-q", resume))
        say(f"q: resuming at {resume} from its checkpoint")
    for t in epochs:
        first = 0
        if resume is not None:
            if t < resume[0] or (t == resume[0] and resume[1] == ITERATIONS):
                continue
            if t == resume[0]:
                first = resume[1] + 1
        for c in range(first, ITERATIONS + 1):
            if c == 0:
                inputs = frame(spark, wait_for(layout.table("e2"), (t, 0), "q"))
                carried = x if x is not None else spark.createDataFrame([], "node long, value long")
                x = (inputs.alias("i").join(carried.alias("c"), "node", "left")
                     .select("node", ((F.col("i.value") + F.coalesce(F.col("c.value"), F.lit(0))) % MODULUS)
                             .alias("value")))
            else:
                reply = frame(spark, wait_for(layout.table("e5"), (t, c - 1), "q"))
                x = reply.select("node", ((F.col("value") * 5 + t) % MODULUS).alias("value"))
            sent = messages((t, c), x)
            put(layout.table("e4" if c < ITERATIONS else "e3"), (t, c), sent)
            put(layout.table("state-q"), (t, c), sent)
            consumed = through((t, c)) if c > 0 else (through((t - 1, ITERATIONS)) if t > 0 else "empty")
            record(layout, "q", (t, c), XiRecord("q", (t, c), M={"e2": through((t, 0)), "e5": consumed}, N="empty",
                                                 D={"e3": "empty", "e4": "empty"}))
            x = frame(spark, sent)


def body(spark: SparkSession, layout: Layout, epochs: range, resume: Time | None) -> None:
    """y: adds q's message at (t, c) to its running totals and replies; checkpoints after odd c."""
    from pyspark.sql import functions as F

    acc = spark.createDataFrame([], "node long, value long")
    if resume is not None:
        acc = frame(spark, _state(layout, "state-y", resume))
        say(f"y: resuming at {resume} from its checkpoint")
    for t in epochs:
        for c in range(ITERATIONS):
            if resume is not None and (t, c) <= resume:
                continue
            if c > 0:
                crash_point("y", t, f"iteration-{c}")
            x = frame(spark, wait_for(layout.table("e4"), (t, c), "y"))
            joined = x.alias("x").join(acc.alias("a"), "node", "left").select(
                "node", F.col("x.value").alias("x"), F.coalesce(F.col("a.value"), F.lit(0)).alias("a"))
            totals = joined.select("node", "x", ((F.col("a") + F.col("x")) % MODULUS).alias("value"))
            reply = totals.select("node", ((F.col("x") * 3 + F.col("value") + c) % MODULUS).alias("value"))
            put(layout.table("e5"), (t, c), messages((t, c), reply))
            kept = messages((t, c), totals.select("node", "value"))
            xi = XiRecord("y", (t, c), M={"e4": through((t, c))}, N="empty", D={"e5": through((t, c + 1))})
            if c % 2 == 1:
                put(layout.table("state-y"), (t, c), kept)
                record(layout, "y", (t, c), xi)
            record(layout, "y", None, xi)
            acc = frame(spark, kept)


def report(spark: SparkSession, layout: Layout, epoch: int) -> None:
    """r: the sum of q's epoch result, one row per epoch."""
    from pyspark.sql import functions as F

    rows = frame(spark, wait_for(layout.table("e3"), (epoch, ITERATIONS), "r"))
    total = rows.select(F.lit(0).cast("long").alias("node"), (F.sum("value") % MODULUS).cast("long").alias("value"))
    put(layout.table("report"), (epoch, 0), messages((epoch, 0), total))
    record(layout, "r", (epoch, 0), XiRecord("r", epoch, M={"e3": through(epoch)}, N=through(epoch)))


def _state(layout: Layout, name: str, at: Time) -> pa.Table:
    rows = get(layout.table(name), at)
    if rows is None:
        raise RuntimeError(f"--resume {at[0]},{at[1]}: {layout.table(name)} has no checkpoint at {at}")
    return rows


# -- recovery ---------------------------------------------------------------------------------------------

def plan(layout: Layout, failed: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scenario the records describe, with ``failed`` processors' state lost, and each
    processor's frontier (its last time, ``"top"`` or ``None``) the solver picks for it."""
    doc = scenario_from_records("cycle", PROCESSORS, EDGES, records(layout), failed)
    return doc, rollback_times(doc)


def roll_back(layout: Layout, frontiers: dict[str, Any]) -> dict[str, int]:
    """Delete, from each rolled-back processor's own tables, every row at a time beyond its
    frontier: checkpoints, state, records, and the messages it sent. What is left in a channel
    beyond its receiver's frontier (q's logged e4 at (1, 4)) is what the receiver reads next.
    Returns the rows deleted per table."""
    deleted = {}
    for pid, at in frontiers.items():
        if at == TOP:
            continue
        lex = PROCESSORS[pid] == "lex"
        if at is None:
            beyond = "true"
        elif lex:
            beyond = f"epoch > {at[0]} OR (epoch = {at[0]} AND iteration > {at[1]})"
        else:
            beyond = f"epoch > {at}"
        for uri in layout.owned(pid):
            table = open_table(uri)
            if table is None:
                continue
            where = f"kind = 'live' OR {beyond}" if uri.endswith(f"records-{pid}") else beyond
            metrics = table.delete(where)
            deleted[uri] = int(metrics.get("num_deleted_rows", 0) or 0)
    return deleted


def _epochs(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def _time(text: str) -> Time:
    epoch, _, iteration = text.partition(",")
    return int(epoch), int(iteration)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m falkirk.spark_jobs.loops.cycle", description=__doc__.split("\n")[0])
    parser.add_argument("role", choices=["source", "prepare", "head", "body", "report"])
    parser.add_argument("--store", required=True)
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--epoch", type=int, help="source, prepare, report: the epoch")
    parser.add_argument("--epochs", type=_epochs, default=range(0, 1), help="head, body: FIRST-LAST")
    parser.add_argument("--resume", type=_time, help="head, body: EPOCH,ITERATION of the checkpoint to start after")
    args = parser.parse_args(argv)
    layout = Layout(args.store, args.scratch)
    if args.role in ("source", "prepare", "report") and args.epoch is None:
        parser.error(f"{args.role} needs --epoch")
    spark = channels.spark_session()
    if args.role == "head":
        head(spark, layout, args.epochs, args.resume)
    elif args.role == "body":
        body(spark, layout, args.epochs, args.resume)
    else:
        {"source": source, "prepare": prepare, "report": report}[args.role](spark, layout, args.epoch)
    say(f"{args.role}: done")
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())
