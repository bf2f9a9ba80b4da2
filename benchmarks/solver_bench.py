"""Solver benchmark: full solves and incremental updates on random layered graphs.

Graphs are layered DAGs of epoch processors (each with 1–3 inputs from the previous
layer), optionally with loops (back edges to an earlier layer), 10 to 100 persisted
checkpoints per processor, and 1% failed. Live processors offer ⊤ with exact metadata.
By default each processor checkpoints every k-th epoch (k in 1, 2, 5, 10: 10 to 100
checkpoints over 100 epochs), as the regimes do, lagging up to 9 epochs behind;
``--uncoordinated`` draws checkpoint epochs at random instead, which rolls almost every
processor back to ∅ (the domino effect of spec S1a), the solver's worst case.
About a third of the processors log their outputs (D̄ = ∅), the rest discard (D̄ = f).

For each size it reports the median time of a full solve, of an incremental update for
one new failure, and of one for one new checkpoint, with the ratios incremental/full;
on sizes up to ``--check-upto`` it also checks that the incremental answers equal full
solves.

    make bench                      # sizes 10, 100, 1000, 10000
    .venv/bin/python -m benchmarks.solver_bench --sizes 10 100 --repeat 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass

from falkirk.policies.rollback.graph import Edge, Graph, Processor
from falkirk.policies.rollback.metadata import Chain, Checkpoint
from falkirk.policies.rollback.solver import Solver
from falkirk.policies.rollback.times import EPOCH, INF

LATEST = 151  # every processor has seen epochs 0..150


@dataclass
class Case:
    graph: Graph
    chains: dict[str, Chain]
    logs: dict[str, bool]


def make_case(n: int, loops: bool, rng: random.Random, checkpoints: tuple[int, int] = (10, 100),
              aligned: bool = True) -> Case:
    width = max(1, int(n ** 0.5))
    ids = [f"p{i}" for i in range(n)]
    layers = [ids[i:i + width] for i in range(0, n, width)]
    edges: list[Edge] = []
    for k in range(1, len(layers)):
        for q in layers[k]:
            for src in rng.sample(layers[k - 1], min(len(layers[k - 1]), rng.randint(1, 3))):
                edges.append(Edge(f"e{len(edges)}", src, q))
    if loops:
        for k in range(2, len(layers), 2):  # back edges close loops over two layers
            src, dst = rng.choice(layers[k]), rng.choice(layers[k - 2])
            edges.append(Edge(f"e{len(edges)}", src, dst))
    failed = set(rng.sample(ids, max(1, n // 100)))
    graph = Graph([Processor(p, EPOCH, p in failed) for p in ids], edges)
    logs = {p: rng.random() < 0.35 for p in ids}
    chains = {}
    for p in ids:
        if aligned:  # every k-th epoch, as the regimes checkpoint; a processor may lag a little
            every = rng.choice([k for k in (1, 2, 5, 10) if checkpoints[0] <= 100 // k <= checkpoints[1]] or [1])
            done = 100 - rng.randint(0, 9)
            epochs = list(range(every, done + 1, every))
        else:  # uncoordinated: random epochs (the domino case of spec S1a)
            count = rng.randint(*checkpoints)
            epochs = sorted(rng.sample(range(1, LATEST), min(count, LATEST - 1)))
        ins = [e.id for e in graph.in_edges(p)]
        outs = [e.id for e in graph.out_edges(p)]
        cps = [Checkpoint(0, dict.fromkeys(ins, 0), 0, dict.fromkeys(outs, 0))]
        for t in epochs:
            cps.append(checkpoint_at(t, ins, outs, logs[p]))
        if p not in failed:
            cps.append(Checkpoint(INF, dict.fromkeys(ins, LATEST), LATEST,
                                  dict.fromkeys(outs, 0 if logs[p] else LATEST)))
        chains[p] = Chain(EPOCH, cps, failed=p in failed)
    return Case(graph, chains, logs)


def checkpoint_at(bound: int, ins: list[str], outs: list[str], logs: bool) -> Checkpoint:
    return Checkpoint(bound, dict.fromkeys(ins, bound), bound, dict.fromkeys(outs, 0 if logs else bound))


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def bench_size(n: int, loops: bool, repeat: int, check: bool, rng: random.Random,
               checkpoints: tuple[int, int] = (10, 100), aligned: bool = True) -> dict[str, float]:
    case = make_case(n, loops, rng, checkpoints, aligned)
    full_times = []
    for _ in range(repeat):
        seconds, _ = timed(lambda: Solver(case.graph, case.chains).solve())
        full_times.append(seconds)
    solver = Solver(case.graph, case.chains)
    solver.solve()
    fail_times, add_times = [], []
    live = [p for p in case.graph.ids() if case.chains[p].has_top]
    for _ in range(repeat):
        victim = rng.choice(live)
        live.remove(victim)
        seconds, answer = timed(lambda: solver.fail(victim))
        fail_times.append(seconds)
        if check:
            assert_same(answer, Solver(case.graph, solver.chains).solve())
    for _ in range(repeat):
        pid = rng.choice(case.graph.ids())
        chain = solver.chains[pid]
        last = chain.without_top()[len(chain.without_top()) - 1].f
        if last + 1 >= LATEST:  # a new checkpoint stays below ⊤'s metadata
            continue
        ins = [e.id for e in case.graph.in_edges(pid)]
        outs = [e.id for e in case.graph.out_edges(pid)]
        new = checkpoint_at(last + 1, ins, outs, case.logs[pid])
        seconds, answer = timed(lambda: solver.add_checkpoint(pid, new))
        add_times.append(seconds)
        if check:
            assert_same(answer, Solver(case.graph, solver.chains).solve())
    full = statistics.median(full_times)
    fail = statistics.median(fail_times)
    add = statistics.median(add_times) if add_times else float("nan")
    return {"full": full, "fail": fail, "add": add, "edges": len(case.graph.edges),
            "checkpoints": sum(len(c) for c in case.chains.values())}


def assert_same(a, b) -> None:
    if (a.index, a.notification) != (b.index, b.notification):
        raise AssertionError("incremental answer differs from a full solve")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--repeat", type=int, default=7, help="runs per measurement (median reported)")
    parser.add_argument("--check-upto", type=int, default=1000,
                        help="check incremental answers against full solves up to this size")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--checkpoints", type=int, nargs=2, default=[10, 100], metavar=("MIN", "MAX"),
                        help="persisted checkpoints per processor (default 10 100)")
    parser.add_argument("--uncoordinated", action="store_true",
                        help="checkpoint at random epochs instead of every k-th (the domino worst case)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    header = (f"{'graph':<6} {'processors':>10} {'edges':>7} {'checkpoints':>11} {'full solve':>11} "
              f"{'+failure':>10} {'+checkpoint':>12} {'failure/full':>13} {'checkpoint/full':>16}")
    print(header)
    print("-" * len(header))
    for loops in (False, True):
        for n in args.sizes:
            print(f"  ... {'loops' if loops else 'DAG'} n={n}", end="\r", file=sys.stderr, flush=True)
            r = bench_size(n, loops, args.repeat, n <= args.check_upto, rng, tuple(args.checkpoints),
                           not args.uncoordinated)
            print(f"{'loops' if loops else 'DAG':<6} {n:>10} {r['edges']:>7} {r['checkpoints']:>11} "
                  f"{r['full'] * 1e3:>9.1f}ms {r['fail'] * 1e3:>8.2f}ms {r['add'] * 1e3:>10.2f}ms "
                  f"{r['fail'] / r['full']:>13.4f} {r['add'] / r['full']:>16.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
