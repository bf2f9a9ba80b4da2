"""The reset after choosing frontiers (Falkirk Wheel §3.6) and the channels at restart (what each receiver held, which the paper leaves implicit).

Once the solver has chosen f(p) for every processor:

* F*′(p) keeps the checkpoints within f(p) (and drops the temporary ⊤);
* p restores S(p, f(p)): a failed processor loads that checkpoint, a live one with
  f(p) ⊊ ⊤ discards the in-memory effects of times outside f(p), and a live one at ⊤
  keeps going;
* Q′(e), the logged messages p re-sends on e, are those of L(e, f(p)) (logged and caused
  by events within f(p)) at times the receiver rolled back past, in send order;
* a receiver that rolled back gets exactly Q′(e) in its queue; a receiver at ⊤ keeps
  the queued messages caused within f(src) and drops the rest (the sender regenerates them).

>>> from falkirk.policies.rollback.times import EPOCH, INF
>>> from falkirk.policies.rollback.graph import Edge, Graph, Processor
>>> g = Graph([Processor("u", EPOCH), Processor("v", EPOCH)], [Edge("e", "u", "v")])
>>> log = [Message("e", s, time=s, cause=s) for s in range(4)]      # u logged epochs 0..3
>>> [m.seq for m in resend(g, {"u": INF, "v": 2}, {"e": log})["e"]]  # v kept epochs < 2
[2, 3]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from falkirk.policies.rollback.graph import Graph
from falkirk.policies.rollback.solver import Solution
from falkirk.policies.rollback.times import Bound


@dataclass(frozen=True)
class Message:
    """A message as the sender's log keeps it: its time is in the receiver's domain, its
    cause (the time of the event whose processing sent it) in the sender's."""

    edge: str
    seq: int
    time: Any
    cause: Any
    payload: Any = None


@dataclass(frozen=True)
class Restore:
    """How one processor resumes: ``"keep"`` (live at ⊤), ``"discard"`` (live, drop in-memory
    work outside f(p)) or ``"load"`` (failed: read checkpoint ``index`` from storage)."""

    action: str
    index: int


@dataclass(frozen=True)
class ResetPlan:
    """Everything the reset decides: restores, the kept chains F*′ and the restart queues."""

    restore: Mapping[str, Restore]
    kept: Mapping[str, int]  # how many checkpoints of F*(p) stay (F*′(p) is that prefix)
    queues: Mapping[str, list[Message]]


def resend(graph: Graph, frontiers: Mapping[str, Bound], logs: Mapping[str, Sequence[Message]]) -> dict[str, list[Message]]:
    """Q′(e) for every edge: the logged messages its sender must send again, in log order."""
    out: dict[str, list[Message]] = {}
    for e in graph.edges:
        src, dst = graph.processor(e.src).domain, graph.processor(e.dst).domain
        fs, fd = frontiers[e.src], frontiers[e.dst]
        if fd == dst.top:
            out[e.id] = []
            continue
        out[e.id] = [m for m in logs.get(e.id, ()) if src.contains(fs, m.cause) and not dst.contains(fd, m.time)]
    return out


def reset(
    graph: Graph,
    solution: Solution,
    logs: Mapping[str, Sequence[Message]],
    queued: Mapping[str, Sequence[Message]] | None = None,
) -> ResetPlan:
    """The reset of Falkirk Wheel §3.6 with the channel rule at restart (``queued``: what each receiver held).

    >>> from falkirk.policies.rollback.times import EPOCH, INF
    >>> from falkirk.policies.rollback.graph import Edge, Graph, Processor
    >>> from falkirk.policies.rollback.metadata import Chain, Checkpoint
    >>> from falkirk.policies.rollback.solver import solve
    >>> g = Graph([Processor("u", EPOCH), Processor("v", EPOCH, failed=True)], [Edge("e", "u", "v")])
    >>> chains = {"u": Chain(EPOCH, [Checkpoint(0, N=0, D={"e": 0}), Checkpoint(INF, N=0, D={"e": 0})]),
    ...           "v": Chain(EPOCH, [Checkpoint(0, M={"e": 0}, N=0), Checkpoint(2, M={"e": 2}, N=0)], failed=True)}
    >>> plan = reset(g, solve(g, chains), {"e": [Message("e", s, time=s, cause=s) for s in range(4)]})
    >>> plan.restore["u"].action, plan.restore["v"], [m.time for m in plan.queues["e"]]
    ('keep', Restore(action='load', index=1), [2, 3])
    """
    frontiers = {pid: solution.bound(pid) for pid in graph.ids()}
    restore, kept = {}, {}
    for p in graph.processors:
        chain, i = solution.chains[p.id], solution.index[p.id]
        at_top = chain[i].f == p.domain.top
        if p.failed or not chain.has_top:
            restore[p.id] = Restore("load", i)
        else:
            restore[p.id] = Restore("keep" if at_top else "discard", i)
        kept[p.id] = i if at_top else i + 1  # F*′(p) = {f′ ∈ F*(p) : f′ ⊆ f(p)}, without ⊤
    q_prime = resend(graph, frontiers, logs)
    queues: dict[str, list[Message]] = {}
    for e in graph.edges:
        src, dst = graph.processor(e.src).domain, graph.processor(e.dst).domain
        if frontiers[e.dst] == dst.top:
            queues[e.id] = [m for m in (queued or {}).get(e.id, ()) if src.contains(frontiers[e.src], m.cause)]
        else:
            queues[e.id] = q_prime[e.id]
    return ResetPlan(restore, kept, queues)
