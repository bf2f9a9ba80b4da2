"""Property tests of the rollback solver against a brute-force oracle, on random small graphs.

Graphs have cycles, mixed domains (epoch, lex (t, c), seq), every projection kind that
fits, notifications on and off, and random failed processors. The oracle enumerates every
choice in the product of the F*(p), keeps the consistent ones (C2, C3 and the existence
of notification frontiers for C4), and takes the pointwise greatest.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from falkirk.policies.rollback.graph import Edge, Graph, Processor
from falkirk.policies.rollback.metadata import Chain, Checkpoint
from falkirk.policies.rollback.projections import make_projection
from falkirk.policies.rollback.solver import Solver
from falkirk.policies.rollback.times import Bound, Domain, EPOCH, EpochDomain, INF, LexDomain, SeqDomain

LEX = LexDomain(2)


@dataclass
class Problem:
    graph: Graph
    chains: dict[str, Chain]
    notifications: bool

    def solver(self) -> Solver:
        return Solver(self.graph, self.chains, self.notifications)


# -- random problems ----------------------------------------------------------------------

def random_bound(rng: random.Random, dom: Domain) -> Bound:
    if isinstance(dom, EpochDomain):
        return rng.randint(0, 5)
    if isinstance(dom, LexDomain):
        return (rng.randint(0, 2), rng.randint(0, 3))
    return tuple(rng.randint(0, 3) for _ in dom.edges) + (0,)


def step_up(rng: random.Random, dom: Domain, b: Bound) -> Bound:
    """A frontier strictly above ``b`` (finite)."""
    if isinstance(dom, EpochDomain):
        return b + rng.randint(1, 2)
    if isinstance(dom, LexDomain):
        return (b[0], b[1] + rng.randint(1, 2)) if rng.random() < 0.5 else (b[0] + 1, rng.randint(0, 2))
    if not dom.edges:
        return None  # a seq processor without inputs has only ∅ and ⊤
    out = list(b)
    out[rng.randrange(len(dom.edges))] += rng.randint(1, 2)
    return tuple(out)


def between(dom: Domain, low: Bound, value: Bound, high: Bound | None) -> Bound:
    """``value`` pushed into [low, high]: join with low, then meet with high."""
    v = dom.join(low, value)
    return v if high is None else dom.meet(v, dom.join(low, high))


def random_metadata(rng, dom, f, prev: Checkpoint | None, ins, out_doms, recorded, upper: Checkpoint | None):
    """Metadata for a checkpoint at ``f`` that keeps every invariant of the chain."""
    if prev is None:  # ∅: all bars ∅
        return Checkpoint(f, {d: dom.empty for d in ins}, dom.empty,
                          {e: od.empty for e, od in out_doms.items()},
                          {e: out_doms[e].empty for e in recorded})
    M = {}
    for d in ins:
        r = random_bound(rng, dom)
        if isinstance(dom, SeqDomain):
            i = dom.index[d]
            r = tuple(min(r[i], f[i]) if j == i else 0 for j in range(len(dom.edges))) + (0,)
        else:
            r = dom.meet(r, f)
        M[d] = between(dom, prev.M[d], r, upper.M[d] if upper else None)
    if isinstance(dom, SeqDomain):
        N = dom.empty
    else:
        N = between(dom, prev.N, dom.meet(random_bound(rng, dom), f), upper.N if upper else None)
    D = {e: between(od, prev.D[e], random_bound(rng, od) if rng.random() < 0.7 else od.empty,
                    upper.D[e] if upper else None) for e, od in out_doms.items()}
    phi = {e: out_doms[e].join(prev.phi[e], random_bound(rng, out_doms[e])) for e in recorded}
    return Checkpoint(f, M, N, D, phi)


def random_problem(seed: int) -> tuple[Problem, random.Random]:
    rng = random.Random(seed)
    n = rng.randint(1, 4)
    ids = [f"p{i}" for i in range(n)]
    kinds = {pid: rng.choice(["epoch", "epoch", "lex", "seq"]) for pid in ids}
    pairs = [(a, b) for a in ids for b in ids if a != b]
    rng.shuffle(pairs)
    chosen = pairs[: rng.randint(0, min(len(pairs), 5))]  # may form cycles
    edges = []
    for k, (a, b) in enumerate(chosen):
        ka, kb = kinds[a], kinds[b]
        options = ["empty", "recorded"]
        if ka == kb == "epoch" or ka == kb == "lex":
            options += ["identity", "identity"]
        if ka == kb == "lex":
            options.append("feedback")
        if (ka, kb) == ("epoch", "lex"):
            options.append("ingress")
        if (ka, kb) == ("lex", "epoch"):
            options.append("egress")
        edges.append(Edge(f"e{k}", a, b, rng.choice(options)))
    domains: dict[str, Domain] = {}
    for pid in ids:
        domains[pid] = {"epoch": EPOCH, "lex": LEX}.get(kinds[pid]) or SeqDomain(
            [e.id for e in edges if e.dst == pid])
    failed = {pid: rng.random() < 0.35 for pid in ids}
    graph = Graph([Processor(pid, domains[pid], failed[pid]) for pid in ids], edges)
    chains = {}
    for pid in ids:
        dom = domains[pid]
        ins = [e.id for e in graph.in_edges(pid)]
        out_doms = {e.id: domains[e.dst] for e in graph.out_edges(pid)}
        recorded = [e.id for e in graph.out_edges(pid) if e.phi == "recorded"]
        bounds = [dom.empty]
        for _ in range(rng.randint(0, 3)):
            nxt = step_up(rng, dom, bounds[-1])
            if nxt is None:
                break
            bounds.append(nxt)
        if not failed[pid]:
            bounds.append(dom.top)
        cps: list[Checkpoint] = []
        for f in bounds:
            cps.append(random_metadata(rng, dom, f, cps[-1] if cps else None, ins, out_doms, recorded, None))
        chains[pid] = Chain(dom, cps, in_domains={d: dom for d in ins}, out_domains=out_doms, failed=failed[pid])
    return Problem(graph, chains, rng.random() < 0.6), rng


# -- the oracle -----------------------------------------------------------------------------

def greatest_fn(problem: Problem, f: dict[str, Bound], phis) -> dict[str, Bound]:
    g = problem.graph
    fn = dict(f)
    while True:
        new = {}
        for pid in g.ids():
            dom = g.processor(pid).domain
            v = dom.meet(f[pid], fn[pid])
            for d in g.in_edges(pid):
                v = dom.meet(v, phis[d.id].apply(fn[d.src]))
            new[pid] = v
        if new == fn:
            return fn
        fn = new


def consistent(problem: Problem, index: dict[str, int], phis) -> dict[str, Bound] | None:
    """The greatest f_n if the choice ``index`` satisfies C2–C4, else None."""
    g, chains = problem.graph, problem.chains
    f = {pid: chains[pid][i].f for pid, i in index.items()}
    for pid, i in index.items():
        cp, dom = chains[pid][i], g.processor(pid).domain
        for e in g.out_edges(pid):
            if not g.processor(e.dst).domain.subset(cp.D[e.id], f[e.dst]):
                return None
        for d in g.in_edges(pid):
            if not dom.subset(cp.M[d.id], phis[d.id].apply(f[d.src])):
                return None
    if not problem.notifications:
        return {pid: g.processor(pid).domain.empty for pid in g.ids()}
    fn = greatest_fn(problem, f, phis)
    for pid, i in index.items():
        if not g.processor(pid).domain.subset(chains[pid][i].N, fn[pid]):
            return None
    return fn


def brute_force(problem: Problem, phis) -> tuple[dict[str, int], dict[str, Bound]]:
    ids = problem.graph.ids()
    solutions = []
    for combo in itertools.product(*(range(len(problem.chains[p])) for p in ids)):
        index = dict(zip(ids, combo))
        fn = consistent(problem, index, phis)
        if fn is not None:
            solutions.append((index, fn))
    greatest = [s for s in solutions if all(all(s[0][p] >= o[0][p] for p in ids) for o in solutions)]
    assert len(greatest) == 1, "the consistent choices have no greatest element"
    return greatest[0]


def phis_of(solver: Solver):
    return solver.phi


SEEDS = st.integers(min_value=0, max_value=2**32 - 1)
SETTINGS = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(SEEDS)
def test_solution_is_consistent_and_equals_brute_force(seed: int) -> None:
    problem, _ = random_problem(seed)
    solver = problem.solver()
    answer = solver.solve()
    fn = consistent(problem, dict(answer.index), solver.phi)
    assert fn is not None, "the solver's answer breaks C2, C3 or C4"
    index, oracle_fn = brute_force(problem, solver.phi)
    assert dict(answer.index) == index
    assert dict(answer.notification) == oracle_fn


@SETTINGS
@given(SEEDS, st.randoms(use_true_random=False))
def test_answer_does_not_depend_on_visiting_order(seed: int, order_rng: random.Random) -> None:
    problem, _ = random_problem(seed)
    reference = problem.solver().solve()
    order = problem.graph.ids()
    order_rng.shuffle(order)
    again = problem.solver().solve(order)
    assert (again.index, again.notification) == (reference.index, reference.notification)


def extra_checkpoint(problem: Problem, rng: random.Random) -> tuple[str, Checkpoint] | None:
    """A new largest persisted checkpoint for a random processor, keeping the invariants."""
    candidates = problem.graph.ids()
    rng.shuffle(candidates)
    for pid in candidates:
        chain = problem.chains[pid]
        dom = chain.domain
        persisted = chain.without_top()
        last = persisted[len(persisted) - 1]
        f = step_up(rng, dom, last.f)
        if f is None:
            continue
        upper = chain[len(chain) - 1] if chain.has_top else None
        g = problem.graph
        ins = [e.id for e in g.in_edges(pid)]
        out_doms = {e.id: g.processor(e.dst).domain for e in g.out_edges(pid)}
        recorded = [e.id for e in g.out_edges(pid) if e.phi == "recorded"]
        return pid, random_metadata(rng, dom, f, last, ins, out_doms, recorded, upper)
    return None


@SETTINGS
@given(SEEDS)
def test_adding_a_checkpoint_never_lowers_a_frontier_and_incremental_equals_full(seed: int) -> None:
    problem, rng = random_problem(seed)
    extra = extra_checkpoint(problem, rng)
    if extra is None:
        return
    pid, checkpoint = extra
    solver = problem.solver()
    before = solver.solve()
    old_bounds = {p: before.bound(p) for p in problem.graph.ids()}
    old_chain = list(problem.chains[pid])
    incremental = solver.add_checkpoint(pid, checkpoint)
    # Neither the caller's chains nor the earlier answer change.
    assert list(problem.chains[pid]) == old_chain and list(before.chains[pid]) == old_chain
    assert {p: before.bound(p) for p in problem.graph.ids()} == old_bounds
    chains = {**problem.chains, pid: solver.chains[pid]}
    assert list(chains[pid]) != old_chain
    full = Solver(problem.graph, chains, problem.notifications).solve()
    assert (incremental.index, incremental.notification) == (full.index, full.notification)
    for p in problem.graph.ids():
        dom = problem.graph.processor(p).domain
        assert dom.subset(old_bounds[p], full.bound(p)), f"{p} fell after a checkpoint was added"


@SETTINGS
@given(SEEDS)
def test_a_new_failure_updates_incrementally_to_the_full_answer(seed: int) -> None:
    problem, rng = random_problem(seed)
    live = [p for p in problem.graph.ids() if problem.chains[p].has_top]
    if not live:
        return
    victim = rng.choice(live)
    solver = problem.solver()
    before = solver.solve()
    given = (list(problem.chains[victim]), problem.chains[victim].failed)
    incremental = solver.fail(victim)
    # Neither the caller's chain nor the earlier answer's changes.
    assert (list(problem.chains[victim]), problem.chains[victim].failed) == given
    assert (list(before.chains[victim]), before.chains[victim].failed) == given
    chains = dict(problem.chains)
    chains[victim] = chains[victim].without_top()
    full = Solver(problem.graph, chains, problem.notifications).solve()
    assert (incremental.index, incremental.notification) == (full.index, full.notification)
    assert incremental.bound(victim) != problem.graph.processor(victim).domain.top


def test_generator_covers_what_the_properties_claim() -> None:
    """Guards the generator: cycles, every domain and projection kind, both switch values, failures."""
    kinds, domains, cycles, switches, failures = set(), set(), 0, set(), 0
    for seed in range(400):
        problem, _ = random_problem(seed)
        g = problem.graph
        kinds.update(e.phi for e in g.edges)
        domains.update(p.domain.kind for p in g.processors)
        switches.add(problem.notifications)
        failures += any(p.failed for p in g.processors)
        succ = {p: {e.dst for e in g.out_edges(p)} for p in g.ids()}
        cycles += any(a in succ[b] for a in g.ids() for b in succ[a])
    assert kinds == {"identity", "ingress", "egress", "feedback", "recorded", "empty"}
    assert domains == {"epoch", "lex", "seq"} and switches == {True, False}
    assert cycles > 20 and failures > 100


def test_incremental_updates_visit_a_small_part_of_a_large_graph() -> None:
    """'Does not redo the whole graph': on 2,000 processors with aligned checkpoints, a new
    failure, and the median new checkpoint, visit far fewer processors than a full solve."""
    from benchmarks.solver_bench import LATEST, checkpoint_at, make_case

    rng = random.Random(7)
    case = make_case(2000, loops=True, rng=rng)
    solver = Solver(case.graph, case.chains)
    full_visits = solver.solve().visits
    assert full_visits >= 2000
    live = [p for p in case.graph.ids() if case.chains[p].has_top]
    for victim in rng.sample(live, 5):
        answer = solver.fail(victim)
        assert answer.visits < full_visits / 20
    add_visits = []
    for pid in rng.sample(case.graph.ids(), 40):
        persisted = solver.chains[pid].without_top()
        last = persisted[len(persisted) - 1].f
        if last + 1 > 100:
            continue
        ins = [e.id for e in case.graph.in_edges(pid)]
        outs = [e.id for e in case.graph.out_edges(pid)]
        answer = solver.add_checkpoint(pid, checkpoint_at(last + 1, ins, outs, case.logs[pid]))
        add_visits.append(answer.visits)
    # A checkpoint can legitimately let a large region rise; the typical one touches little.
    assert len(add_visits) >= 10
    assert sorted(add_visits)[len(add_visits) // 2] < full_visits / 20, add_visits
    again = Solver(case.graph, solver.chains).solve()
    assert (again.index, again.notification) == (answer.index, answer.notification)
    assert LATEST > 100
