"""Regime overhead benchmark: one Spark job over 8.5M rows per epoch, with and without fault tolerance.

Every variant runs the same computation over the same input (``--rows`` click events
per epoch, pre-generated as Parquet and read by each variant, about 2% of them
delivered twice): drop the duplicate deliveries, then per-item totals of the epoch. Stateless variants emit them; stateful variants also fold them into
running totals kept across epochs. Variants:

* ``no FT (stateless)``: what a task without fault tolerance does: outputs written as
  plain Parquet (Spark's own writer) to a scratch directory for the next task; no
  Delta, no versions, no ledger;
* ``no FT (stateful)``: the same, and the running totals are read from and written to a
  plain Parquet directory (two, used in turn, since Spark cannot overwrite what it
  reads), as a task run once per epoch must keep its state somewhere;
* ``ephemeral``, ``batch``, ``batch(log_outputs)``: the stateless job under the runtime's
  commit (``falkirk.spark_jobs.runtime.commit``), compared with no FT (stateless);
* ``lazy_checkpoint(every=10)``, ``eager_checkpoint``: the stateful job under the runtime,
  loading its previous state from the store as each epoch's ``spark-submit`` would,
  compared with no FT (stateful).

By default the regimes' durable store is an S3-compatible server (``moto_server``, started
here) and their scratch tier a local directory, as on the distributed shape; ``--store local``
puts the durable store on the local disk, ``--durable-uri`` names another. The no-FT baselines
write plain Parquet to the local disk either way (Spark here has no S3 connector).

Epochs are interleaved (epoch t of every variant before epoch t+1 of any), and each
regime's epoch is paired with a run of the matching no-FT baseline over the same epoch
immediately before it (the baseline is idempotent per epoch), so drift on a busy machine
hits both sides of a ratio alike. Epoch 1 is a warm-up and is not counted; the table
gives each variant's median per-epoch time, the median extra seconds over its paired
baseline run, and the median of the paired ratios, against the targets in :data:`TARGETS`
(judged only when the baseline's epochs take at least :data:`TARGET_EPOCH_SECONDS`: shorter
epochs measure fixed costs, not the regimes).

    make bench-regimes
    .venv/bin/python -m benchmarks.regime_bench --rows 8500000 --epochs 7 --store local
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, LazyCheckpoint, Ledger, Regime, StoreConfig
from falkirk.policies.job_spec import JobSpec

DAG = "bench"
ITEMS = 20_000  # distinct keys: the size of outputs and state, small next to the input
# The most each regime may cost against no fault tolerance (median paired ratio), on epochs of at
# least TARGET_EPOCH_SECONDS of work with the durable store on S3.
TARGETS = {"batch(log_outputs)": 1.20, "lazy_checkpoint(every=10)": 1.10, "eager_checkpoint": 1.30}
TARGET_EPOCH_SECONDS = 5.0


@dataclass
class Variant:
    name: str
    regime: Regime | None  # None: no fault tolerance
    stateful: bool
    times: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # to the baseline run just before, same epoch
    extra: list[float] = field(default_factory=list)  # seconds over that baseline run

    @property
    def baseline(self) -> str:
        return "no FT (stateful)" if self.stateful else "no FT (stateless)"


def variants() -> list[Variant]:
    return [
        Variant("no FT (stateless)", None, False),
        Variant("ephemeral", Ephemeral(), False),
        Variant("batch", Batch(), False),
        Variant("batch(log_outputs)", Batch(log_outputs=True), False),
        Variant("no FT (stateful)", None, True),
        Variant("lazy_checkpoint(every=10)", LazyCheckpoint(every=10), True),
        Variant("eager_checkpoint", EagerCheckpoint(), True),
    ]


def generate_input(spark, root: Path, epochs: int, rows: int) -> None:
    """Deterministic events per epoch: (event_id, user, item, amount); one in 50 repeats an event_id."""
    from pyspark.sql import functions as F

    for epoch in range(1, epochs + 1):
        (spark.range(rows, numPartitions=4)
         .select(F.when(F.col("id") % 50 == 7, F.col("id") - 1).otherwise(F.col("id")).alias("event_id"),
                 (F.abs(F.xxhash64("event_id", F.lit(epoch))) % 100_000).alias("user"),
                 (F.abs(F.xxhash64(F.lit(epoch), "event_id")) % ITEMS).alias("item"),
                 ((F.abs(F.xxhash64("event_id")) % 1000) - 100).alias("amount"))
         .write.mode("overwrite").parquet(str(root / f"epoch={epoch}")))


def epoch_totals(spark, source: Path, epoch: int):
    from pyspark.sql import functions as F

    events = spark.read.parquet(str(source / f"epoch={epoch}")).dropDuplicates(["event_id"])
    return (events.where("amount > 0").groupBy("item")
            .agg(F.count("*").alias("events"), F.sum("amount").alias("amount"),
                 F.approx_count_distinct("user").alias("users")))


def fold(previous, this):
    """Running totals: previous state plus this epoch's totals."""
    from pyspark.sql import functions as F

    if previous is None:
        return this.select("item", "events", "amount")
    before = previous.select("item", F.col("events").alias("e0"), F.col("amount").alias("a0"))
    return (before.join(this, "item", "full_outer")
            .select("item", (F.coalesce("e0", F.lit(0)) + F.coalesce("events", F.lit(0))).alias("events"),
                    (F.coalesce("a0", F.lit(0)) + F.coalesce("amount", F.lit(0))).alias("amount")))


def run_epoch(spark, variant: Variant, epoch: int, source: Path, store: StoreConfig) -> float:
    from falkirk.spark_jobs.runtime import EpochContext, EpochResult, commit

    started = time.perf_counter()
    this = epoch_totals(spark, source, epoch)
    if variant.regime is None:
        scratch = Path(store.scratch_uri)
        if not variant.stateful:
            this.write.mode("overwrite").parquet(str(scratch / "output" / f"epoch={epoch}"))
            return time.perf_counter() - started
        this.persist()  # as the runtime does: compute this epoch's totals once for both uses
        this.write.mode("overwrite").parquet(str(scratch / "output" / f"epoch={epoch}"))
        previous = spark.read.parquet(str(scratch / f"state-{epoch % 2}")) if epoch > 1 else None
        fold(previous, this).write.mode("overwrite").parquet(str(scratch / f"state-{(epoch + 1) % 2}"))
        this.unpersist()
        return time.perf_counter() - started

    ledger = Ledger(store)
    task = "running" if variant.stateful else "totals"
    spec = JobSpec(dag_id=DAG, task_id=task, epoch=epoch, regime=variant.regime, run_id=f"epoch-{epoch}")
    if ledger.find(DAG, task, epoch) is not None:  # run_job's own check before any work
        raise SystemExit(f"{variant.name}: epoch {epoch} already committed; the store was not empty")
    ctx = EpochContext(spec, store, ledger, spark)
    if variant.stateful:
        result = EpochResult(outputs={"output": this}, state=fold(ctx.previous_state(), this))
    else:
        result = EpochResult(outputs={"output": this})
    commit(ctx, result)
    return time.perf_counter() - started


def regime_store(durable_uri: str | None, scratch_tier: str, local: Path, name: str) -> StoreConfig:
    """A regime variant's store: durable under ``durable_uri`` (or ``local``), scratch on the
    local disk or, with ``scratch_tier="durable"``, beside the durable tables.

    >>> regime_store(None, "durable", Path("/tmp/b/v1"), "v1").scratch_uri
    '/tmp/b/v1/durable/scratch'
    """
    durable = f"{durable_uri.rstrip('/')}/{name}" if durable_uri else str(local / "durable")
    scratch = f"{durable}/scratch" if scratch_tier == "durable" else str(local / "scratch")
    options = {k: v for k, v in os.environ.items() if k.startswith("AWS_")} if durable.startswith("s3://") else {}
    return StoreConfig(durable, scratch, options)


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8_500_000, help="input events per epoch (default 8,500,000: "
                        "about 5.5 s of work per epoch on two cores)")
    parser.add_argument("--epochs", type=int, default=7, help="epochs per variant (the first is a warm-up)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--store", choices=("moto", "local"), default="moto",
                        help="the regimes' durable store: on moto_server, started here (default), or a local "
                        "directory")
    parser.add_argument("--durable-uri", help="another durable store for the regimes; an s3:// URI reads "
                        "AWS_ENDPOINT_URL and the credentials from the environment")
    parser.add_argument("--scratch-tier", choices=("local", "durable"), default="local",
                        help="where the regimes' scratch tables go: a local directory (default), or the durable "
                        "store (no scratch tier)")
    parser.add_argument("--keep", action="store_true", help="keep the stores (printed) for inspection")
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs: need at least 2 (the first is a warm-up)")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(args.master).appName("falkirk-regime-bench")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    root = Path(tempfile.mkdtemp(prefix="falkirk-regime-bench-"))
    say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)
    moto = None
    if args.store == "moto" and not args.durable_uri:
        from devstack.s3 import MotoS3

        moto = MotoS3(root).start()
        moto.create_bucket("bench")
        os.environ.update(moto.storage_options())
        args.durable_uri = "s3://bench/regimes"
    try:
        say(f"generating {args.epochs} epochs x {args.rows:,} events under {root} ...")
        generate_input(spark, root / "source", args.epochs, args.rows)
        runs = variants()
        stores = {v.name: regime_store(args.durable_uri, args.scratch_tier, root / f"v{i}", f"v{i}")
                  if v.regime is not None else StoreConfig(str(root / f"v{i}" / "durable"), str(root / f"v{i}" / "scratch"))
                  for i, v in enumerate(runs)}
        base = {v.name: v for v in runs if v.regime is None}
        regimes = [v for v in runs if v.regime is not None]
        for epoch in range(1, args.epochs + 1):
            for b in base.values():  # each baseline's own epoch (its state advances here)
                seconds = run_epoch(spark, b, epoch, root / "source", stores[b.name])
            order = regimes[epoch % len(regimes):] + regimes[:epoch % len(regimes)]  # rotate who goes first
            for v in order:
                # Paired: the baseline re-runs this same epoch (it is idempotent) right before
                # the variant, so drift on a busy machine hits both sides of each ratio alike.
                b = base[v.baseline]
                before = run_epoch(spark, b, epoch, root / "source", stores[b.name])
                seconds = run_epoch(spark, v, epoch, root / "source", stores[v.name])
                if epoch > 1:
                    b.times.append(before)
                    v.times.append(seconds)
                    v.ratios.append(seconds / before)
                    v.extra.append(seconds - before)
            if epoch > 1:
                say(f"epoch {epoch}/{args.epochs}: " + ", ".join(f"{v.name} {v.ratios[-1]:.2f}x" for v in regimes))
        rows = [["variant", "median s/epoch", "median extra s", "median ratio to no FT", "target"]]
        missed = []
        for v in runs:
            med = statistics.median(v.times)
            if v.regime is None:
                rows.append([v.name, f"{med:.3f}", "", "1.000", ""])
            else:
                ratio, target = statistics.median(v.ratios), TARGETS.get(v.name)
                rows.append([v.name, f"{med:.3f}", f"{statistics.median(v.extra):+.3f}", f"{ratio:.3f}",
                             f"<= {target:.2f}" if target else ""])
                if target and ratio > target:
                    missed.append(f"{v.name}: {ratio:.3f} > {target:.2f}")
        shortest = min(statistics.median(b.times) for b in base.values())
        where = f"durable store {args.durable_uri or 'on the local disk'}, scratch tier " + (
            "in the durable store" if args.scratch_tier == "durable" else "on the local disk")
        print(f"\n{args.rows:,} events per epoch, {args.epochs - 1} measured epochs, master {args.master}, {where}. "
              f"Each regime's epoch is paired with a no-FT run of the same epoch (stateless or stateful, "
              f"as the regime) just before it; ratio = median over epochs of the pair's ratio.\n")
        print(table(rows))
        if shortest < TARGET_EPOCH_SECONDS:
            print(f"\ntargets not judged: a baseline epoch took {shortest:.1f}s, under {TARGET_EPOCH_SECONDS:g}s "
                  f"(raise --rows)")
            missed = []
        else:
            print("\n" + ("\n".join("MISSED " + m for m in missed) if missed else "every target met"))
    finally:
        spark.stop()
        if moto is not None:
            moto.stop()
        if args.keep:
            say(f"stores kept under {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
