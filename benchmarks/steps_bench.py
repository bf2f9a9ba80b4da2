"""Checkpoints inside an epoch: what resuming saves, and what checkpointing costs.

One iterative job (PageRank over a fixed graph of ``--pages`` pages and ten times as many
links, ``--iterations`` iterations per epoch; ``benchmarks.steps_job``) runs as a Spark
Connect client of one local server, each attempt a process of its own as under Airflow:

* **resume**: an attempt is killed (SIGKILL) as iteration ``0.8 * iterations + 1`` starts,
  after its checkpoint at 80%, and the next attempt resumes there; compared with the same
  kill and retry without checkpoints inside the epoch, whose retry redoes the whole epoch.
  The table gives the retries' median times and their ratio.
* **steady state**: a whole epoch checkpointing every ``--every`` iterations, compared with
  the same epoch without (the job still cuts Spark's lineage every ``--every`` iterations,
  with ``localCheckpoint()``, as an iterative Spark job must). Epochs alternate between the
  two, so drift hits both alike; the table gives the median of the paired ratios.

    make bench-steps
    .venv/bin/python -m benchmarks.steps_bench --pages 20000 --iterations 50 --every 5 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devstack.spark import SparkConnectServer
from falkirk.policies import Batch
from falkirk.policies.job_spec import JobSpec
from falkirk.policies.store import StoreConfig

DAG = "bench_steps"


def attempt(store: StoreConfig, remote: str, epoch: int, every: int, iterations: int, pages: int, cut: int,
            try_number: int = 1, crash_at: int | None = None) -> tuple[float, str]:
    """Run one attempt of the job's ``epoch``; (seconds, its log). ``crash_at``: kill it as that iteration starts."""
    spec = JobSpec(dag_id=DAG, task_id=f"rank_every_{every}", epoch=epoch, regime=Batch(log_outputs=True), run_id=f"epoch-{epoch}",
                   try_number=try_number)
    env = {**os.environ, **store.env(), "SPARK_REMOTE": remote, "BENCH_EVERY": str(every),
           "BENCH_ITERATIONS": str(iterations), "BENCH_PAGES": str(pages), "BENCH_CUT": str(cut),
           "FALKIRK_CRASH_AT": f"{spec.task_id}:{epoch}:iteration-{crash_at}" if crash_at else ""}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "benchmarks.steps_job", *spec.argv()], env=env,
                         capture_output=True, text=True)
    seconds = time.monotonic() - started
    killed = crash_at is not None
    if (run.returncode != 0) != killed:
        raise SystemExit(f"attempt of epoch {epoch} (every={every}, crash_at={crash_at}) exited {run.returncode}:\n"
                         f"{run.stderr[-3000:]}")
    return seconds, run.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="kill-and-retry pairs and steady-state epoch pairs")
    args = parser.parse_args(argv)
    kill_at = args.iterations * 8 // 10 + 1
    none = args.iterations + 1  # a checkpoint interval past the last iteration: none inside the epoch
    with tempfile.TemporaryDirectory(prefix="falkirk-steps-bench-") as tmp:
        root = Path(tmp)
        store = StoreConfig(str(root / "durable"), str(root / "scratch"))
        with SparkConnectServer(root / "spark") as server:
            run = lambda *a, **k: attempt(store, server.url, *a, iterations=args.iterations, pages=args.pages,
                                        cut=args.every, **k)
            run(1, args.every)  # warm-up: the server's first queries are slower
            steady, retries = {"with": [], "none": []}, {"resume": [], "redo": []}
            ratios = []
            epoch = 2
            for r in range(args.rounds):
                with_cp, _ = run(epoch, args.every)
                without, _ = run(epoch, none)
                steady["with"].append(with_cp)
                steady["none"].append(without)
                ratios.append(with_cp / without)
                epoch += 1
                for name, every in (("resume", args.every), ("redo", none)):
                    run(epoch, every, crash_at=kill_at)
                    seconds, log = run(epoch, every, try_number=2)
                    if name == "resume" and f"resuming at iteration {kill_at - 1} of {args.iterations}" not in log:
                        raise SystemExit(f"the retry did not resume at iteration {kill_at - 1}:\n{log[-3000:]}")
                    retries[name].append(seconds)
                epoch += 1
                print(f"round {r + 1}/{args.rounds}: steady {with_cp:.1f}s vs {without:.1f}s; retry "
                      f"{retries['resume'][-1]:.1f}s vs {retries['redo'][-1]:.1f}s", flush=True)
    med = statistics.median
    resume_ratio = med(retries["resume"]) / med(retries["redo"])
    print()
    print(f"PageRank, {args.pages:,} pages, {args.pages * 10:,} links, {args.iterations} iterations per epoch, "
          f"{args.rounds} rounds (medians)")
    print(f"{'measure':<52} {'with checkpoints':>17} {'without':>9} {'ratio':>7} {'target':>7}")
    print(f"{'retry after a kill at ' + str(kill_at - 1) + '/' + str(args.iterations) + ' iterations':<52} "
          f"{med(retries['resume']):>16.1f}s {med(retries['redo']):>8.1f}s {resume_ratio:>7.2f} {'<= 0.30':>7}")
    print(f"{'an epoch, a checkpoint every ' + str(args.every) + ' iterations':<52} "
          f"{med(steady['with']):>16.1f}s {med(steady['none']):>8.1f}s {med(ratios):>7.2f} {'<= 1.10':>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
