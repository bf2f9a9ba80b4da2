"""Asset edges between DAGs (``Consumed``) in the rollback solver, against a brute-force oracle.

Random pipelines of two or three DAGs: each DAG one or two epoch-domain processors joined by
identity edges, and DAGs joined by asset edges along which each consumer run consumed a
random batch of the producer's epochs (one per run, or several: the asset events that arrived
since the consumer's previous run). The oracle never uses φ: it enumerates every choice of
checkpoints and keeps those in which no kept state depends on a dropped input, i.e. every
consumer run a kept checkpoint has read from an asset edge consumed only producer epochs the
producer keeps (and a producer rolled back to nothing leaves its consumers no reads, the spec's
φ(∅) = ∅); then it takes the pointwise greatest.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from falkirk.policies.rollback.graph import Edge, Graph, Processor
from falkirk.policies.rollback.metadata import Chain, Checkpoint
from falkirk.policies.rollback.projections import Consumed, ProjectionError
from falkirk.policies.rollback.solver import Solver
from falkirk.policies.rollback.times import EPOCH, INF, LexDomain


@dataclass
class Pipeline:
    graph: Graph
    chains: dict[str, Chain]
    consumed: dict[str, dict[int, frozenset[int]]]  # asset edge id -> consumer run -> producer epochs

    def solver_chains(self) -> dict[str, Chain]:
        """The chains with each asset edge's φ recorded on its producer's checkpoints."""
        chains = dict(self.chains)
        for e in self.graph.edges:
            if e.id in self.consumed:
                chains[e.src] = Consumed(EPOCH, EPOCH, self.consumed[e.id]).record_into(chains[e.src], e.id)
        return chains


def random_consumption(rng: random.Random, epochs: int) -> dict[int, frozenset[int]]:
    """Consumer runs 1, 2, ... each consuming the next non-empty batch of producer epochs 1..epochs."""
    runs: dict[int, frozenset[int]] = {}
    epoch, run = 1, 1
    one_per_run = rng.random() < 0.3
    while epoch <= epochs:
        size = 1 if one_per_run else rng.randint(1, 3)
        runs[run] = frozenset(range(epoch, min(epoch + size, epochs + 1)))
        epoch += size
        run += 1
    return runs


def random_chain(rng: random.Random, ins: list[str], failed: bool) -> Chain:
    bounds = [0] + sorted(rng.sample(range(1, 8), rng.randint(0, 4)))
    checkpoints = []
    prev = {d: 0 for d in ins}
    for f in bounds:
        M = {d: rng.randint(prev[d], f) for d in ins}
        prev = M
        checkpoints.append(Checkpoint(f, M, 0, {}))
    if not failed:
        checkpoints.append(Checkpoint(INF, {d: INF for d in ins}, 0, {}))
    return Chain(EPOCH, checkpoints, in_domains={d: EPOCH for d in ins}, failed=failed)


def random_pipeline(seed: int) -> Pipeline:
    rng = random.Random(seed)
    dags = rng.randint(2, 3)
    processors: list[Processor] = []
    edges: list[Edge] = []
    firsts, lasts = [], []
    failed = {}
    for d in range(dags):
        ids = [f"d{d}.t{i}" for i in range(rng.randint(1, 2))]
        for pid in ids:
            failed[pid] = rng.random() < 0.4
            processors.append(Processor(pid, EPOCH, failed[pid]))
        for a, b in zip(ids, ids[1:]):
            edges.append(Edge(f"{a}>{b}", a, b, "identity"))
        firsts.append(ids[0])
        lasts.append(ids[-1])
    consumed = {}
    for d in range(1, dags):  # each later DAG consumes an Asset of an earlier one (a chain or a fan-out)
        producer = lasts[rng.randrange(d)]
        edge = Edge(f"{producer}=>{firsts[d]}", producer, firsts[d], "recorded")
        edges.append(edge)
        consumed[edge.id] = random_consumption(rng, rng.randint(1, 7))
    chains = {p.id: random_chain(rng, [e.id for e in edges if e.dst == p.id], failed[p.id]) for p in processors}
    return Pipeline(Graph(processors, edges), chains, consumed)


# -- the oracle ------------------------------------------------------------------------------

def consistent(pipeline: Pipeline, choice: dict[str, Checkpoint]) -> bool:
    for e in pipeline.graph.edges:
        kept_by_sender = choice[e.src].f  # the sender keeps its epochs below this
        read = choice[e.dst].M.get(e.id, 0)  # the receiver's kept state read its inputs below this
        if e.id in pipeline.consumed:
            if kept_by_sender == 0 and read > 0:  # a producer back to nothing: its consumers keep no reads (φ(∅) = ∅)
                return False
            for run, epochs in pipeline.consumed[e.id].items():
                if run < read and max(epochs) >= kept_by_sender:
                    return False
        elif read > kept_by_sender:
            return False
    return True


def oracle(pipeline: Pipeline) -> dict[str, int]:
    ids = [p.id for p in pipeline.graph.processors]
    best: dict[str, int] | None = None
    for index in itertools.product(*(range(len(pipeline.chains[pid])) for pid in ids)):
        choice = {pid: pipeline.chains[pid][i] for pid, i in zip(ids, index)}
        if consistent(pipeline, choice):
            picked = dict(zip(ids, index))
            best = picked if best is None else {pid: max(best[pid], picked[pid]) for pid in ids}
    assert best is not None, "all-empty is always consistent"
    assert consistent(pipeline, {pid: pipeline.chains[pid][i] for pid, i in best.items()}), "greatest not consistent"
    return best


# -- properties ------------------------------------------------------------------------------

@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_the_solver_with_asset_edges_equals_the_oracle(seed: int) -> None:
    pipeline = random_pipeline(seed)
    answer = Solver(pipeline.graph, pipeline.solver_chains(), notifications=False).solve()
    assert dict(answer.index) == oracle(pipeline)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_consumed_is_monotone_and_keeps_exactly_the_runs_that_read_kept_epochs(seed: int) -> None:
    rng = random.Random(seed)
    runs = random_consumption(rng, rng.randint(1, 9))
    phi = Consumed(EPOCH, EPOCH, runs)
    values = [phi.apply(f) for f in range(0, 12)] + [phi.apply(INF)]
    assert values == sorted(values) and values[0] == 0 and values[-1] == INF
    for f in range(1, 12):
        kept = phi.apply(f)
        assert all(max(runs[k]) < f for k in runs if k < kept)  # every kept run read kept epochs only
        assert kept == INF or max(runs[kept]) >= f  # and the first dropped one did not


def test_a_bad_producer_epoch_drops_the_consumer_runs_from_the_first_that_read_it() -> None:
    # The producer's ingest (batch) and totals (eager checkpoint at every epoch) ran epochs 1-6;
    # the consumer DAG's report ran on the Asset of totals three times: on epochs 1-2, 3-4, 5-6,
    # keeping a running state checkpointed after each run. Epoch 3 of ingest turns out bad.
    ingest = Chain(EPOCH, [Checkpoint(0), Checkpoint(3)], failed=True)  # keeps epochs 1-2
    totals = Chain(EPOCH, [Checkpoint(f, {"i>t": f}, 0, {}) for f in range(0, 7)] + [
        Checkpoint(INF, {"i>t": INF}, 0, {})], in_domains={"i>t": EPOCH})
    report = Chain(EPOCH, [Checkpoint(f, {"asset": f}, 0, {}) for f in range(0, 4)] + [
        Checkpoint(INF, {"asset": INF}, 0, {})], in_domains={"asset": EPOCH})
    asset = Consumed(EPOCH, EPOCH, {1: {1, 2}, 2: {3, 4}, 3: {5, 6}})
    graph = Graph([Processor("ingest", EPOCH, True), Processor("totals", EPOCH), Processor("report", EPOCH)],
                  [Edge("i>t", "ingest", "totals"), Edge("asset", "totals", "report", "recorded")])
    chains = {"ingest": ingest, "totals": asset.record_into(totals, "asset"), "report": report}
    answer = Solver(graph, chains, notifications=False).solve()
    # totals keeps epochs 1-2 (restores its checkpoint after 2); report keeps run 1 only, which
    # read epochs 1-2, and redoes runs 2 and 3 from its checkpoint after run 1
    assert {p: answer.bound(p) for p in ("ingest", "totals", "report")} == {"ingest": 3, "totals": 3, "report": 2}


def test_consumed_joins_epoch_domains_only() -> None:
    with pytest.raises(ProjectionError, match="consumed joins two epoch domains"):
        Consumed(EPOCH, LexDomain(2), {1: {1}})
