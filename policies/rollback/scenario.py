"""Rollback scenarios (``falkirk-scenario/1``): read, validate, solve, answer.

The format is ``shared/design/scenario-format.md``. :func:`load_scenario` turns a JSON
document into a :class:`Scenario` (a graph, each processor's F*(p), the notifications
switch) or raises :class:`ScenarioError` whose message starts with the path of the
offending field, e.g. ``processors[2].checkpoints[1].D.e4: unknown edge "e4"``.

>>> doc = {"format": "falkirk-scenario/1", "name": "tiny", "notifications": False,
...        "processors": [
...          {"id": "u", "domain": "epoch", "checkpoints": [{"frontier": "empty"}, {"frontier": "top"}]},
...          {"id": "v", "domain": "epoch", "failed": True,
...           "checkpoints": [{"frontier": "empty"}, {"frontier": {"through": 1}}]}],
...        "edges": [{"id": "e", "src": "u", "dst": "v", "phi": "identity"}]}
>>> load_scenario(doc).answer()["frontiers"]
{'u': {'checkpoint': 0, 'frontier': 'empty'}, 'v': {'checkpoint': 0, 'frontier': 'empty'}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from falkirk.policies.rollback.frontiers import NotationError, format_bound, parse_bound
from falkirk.policies.rollback.graph import Edge, Graph, Processor
from falkirk.policies.rollback.metadata import Chain, Checkpoint, MetadataError
from falkirk.policies.rollback.projections import ProjectionError, make_projection, projection_kinds
from falkirk.policies.rollback.solver import Solution, Solver
from falkirk.policies.rollback.times import EPOCH, Bound, Domain, LexDomain, SeqDomain

FORMAT = "falkirk-scenario/1"
CHECKPOINT_KEYS = {"frontier", "M", "N", "D", "phi"}
PROCESSOR_KEYS = {"id", "domain", "failed", "checkpoints"}
EDGE_KEYS = {"id", "src", "dst", "phi"}
TOP_KEYS = {"format", "name", "notifications", "processors", "edges", "description"}


class ScenarioError(ValueError):
    """An invalid scenario; the message is ``<field path>: <what is wrong and how to fix it>``."""


@dataclass
class Scenario:
    """A validated rollback question."""

    name: str
    graph: Graph
    chains: dict[str, Chain]
    notifications: bool
    written: dict[str, list[Any]]  # each checkpoint's frontier as the input wrote it (echoed back)

    def solver(self) -> Solver:
        return Solver(self.graph, self.chains, self.notifications)

    def solve(self, order: list[str] | None = None) -> Solution:
        return self.solver().solve(order)

    def answer(self, solution: Solution | None = None) -> dict[str, Any]:
        """The JSON answer of ``scenario-format.md``: frontiers and notification frontiers."""
        solution = solution or self.solve()
        return {
            "name": self.name,
            "frontiers": {
                pid: {"checkpoint": solution.index[pid], "frontier": self.written[pid][solution.index[pid]]}
                for pid in self.graph.ids()
            },
            "notification_frontiers": {
                pid: format_bound(solution.notification[pid], self.graph.processor(pid).domain)
                for pid in self.graph.ids()
            },
        }


def load_scenario(doc: Any) -> Scenario:
    """Validate a parsed JSON scenario and build it (raises :class:`ScenarioError`)."""
    _require(isinstance(doc, dict), "(top level)", "a scenario is a JSON object")
    _unknown_keys(doc, TOP_KEYS, "(top level)")
    _require(doc.get("format") == FORMAT, "format", f"must be {FORMAT!r}")
    name = doc.get("name")
    _require(isinstance(name, str) and name != "", "name", "is required (a non-empty string)")
    notifications = doc.get("notifications", True)
    _require(isinstance(notifications, bool), "notifications", "must be true or false")
    procs = doc.get("processors")
    _require(isinstance(procs, list) and bool(procs), "processors", "must be a non-empty list")
    edges_doc = doc.get("edges", [])
    _require(isinstance(edges_doc, list), "edges", "must be a list")

    ids: dict[str, int] = {}
    for i, p in enumerate(procs):
        path = f"processors[{i}]"
        ids[_new_id(p, path, PROCESSOR_KEYS, "processor", ids)] = i
        _require(p.get("domain") in ("epoch", "lex", "seq"), f"{path}.domain", 'must be "epoch", "lex" or "seq"')
        _require(isinstance(p.get("failed", False), bool), f"{path}.failed", "must be true or false")
        _require(isinstance(p.get("checkpoints"), list) and p["checkpoints"], f"{path}.checkpoints",
                 "must be a non-empty list, starting with {\"frontier\": \"empty\"}")

    edges: list[Edge] = []
    edge_ids: dict[str, int] = {}
    for j, e in enumerate(edges_doc):
        path = f"edges[{j}]"
        eid = _new_id(e, path, EDGE_KEYS, "edge", edge_ids)
        edge_ids[eid] = j
        for end in ("src", "dst"):
            _require(e.get(end) in ids, f"{path}.{end}", f"unknown processor {e.get(end)!r}")
        _require(e.get("phi") in projection_kinds(), f"{path}.phi",
                 f"unknown phi {e.get('phi')!r}; use one of {', '.join(projection_kinds())}")
        edges.append(Edge(eid, e["src"], e["dst"], e["phi"]))

    domains = _domains(procs, edges, ids)
    processors = [Processor(p["id"], domains[p["id"]], p.get("failed", False)) for p in procs]
    graph = Graph(processors, edges)
    phis = {}
    for j, e in enumerate(edges):
        try:
            phis[e.id] = make_projection(e.phi, domains[e.src], domains[e.dst])
        except ProjectionError as exc:
            raise ScenarioError(f"edges[{j}].phi: {exc}") from None

    chains: dict[str, Chain] = {}
    written: dict[str, list[Any]] = {}
    for i, p in enumerate(procs):
        pid = p["id"]
        ins = {e.id: e for e in graph.in_edges(pid)}
        outs = {e.id: e for e in graph.out_edges(pid)}
        dom = domains[pid]
        checkpoints = []
        written[pid] = []
        for k, c in enumerate(p["checkpoints"]):
            path = f"processors[{i}].checkpoints[{k}]"
            checkpoints.append(_checkpoint(c, path, dom, ins, outs, domains, phis))
            written[pid].append(c["frontier"])
        try:
            chains[pid] = Chain(dom, checkpoints, in_domains={d: dom for d in ins},
                                out_domains={e: domains[outs[e].dst] for e in outs}, failed=p.get("failed", False))
        except MetadataError as exc:
            raise ScenarioError(f"processors[{i}].{exc}") from None
    return Scenario(name, graph, chains, notifications, written)


def _checkpoint(c: Any, path: str, dom: Domain, ins: Mapping[str, Edge], outs: Mapping[str, Edge],
                domains: Mapping[str, Domain], phis: Mapping[str, Any]) -> Checkpoint:
    _require(isinstance(c, dict), path, "must be an object")
    _unknown_keys(c, CHECKPOINT_KEYS, path)
    _require("frontier" in c, f"{path}.frontier", "is required")
    f = _bound(c["frontier"], dom, f"{path}.frontier")
    is_top = f == dom.top
    for key, allowed, what in (("M", ins, "input"), ("D", outs, "output"), ("phi", outs, "output")):
        value = c.get(key, {})
        _require(isinstance(value, dict), f"{path}.{key}", f"must be an object {{{what}_edge: frontier}}")
        for eid in value:
            _require(eid in allowed, f"{path}.{key}.{eid}",
                     f"unknown edge {eid!r}: {key} names only this processor's {what} edges ({sorted(allowed)})")
    for eid in c.get("phi", {}):
        _require(outs[eid].phi == "recorded", f"{path}.phi.{eid}",
                 f"edge {eid!r} has phi {outs[eid].phi!r}; only recorded edges take values here")

    M = {}
    for d in ins:
        if d in c.get("M", {}):
            M[d] = _bound(c["M"][d], dom, f"{path}.M.{d}")
            if isinstance(dom, SeqDomain) and M[d] == dom.top:  # "top" on edge d: ⊤ restricted to d
                M[d] = _only_edge(dom, d, dom.top)
        elif isinstance(dom, SeqDomain):  # default: only edge d's count of f
            M[d] = _only_edge(dom, d, f)
        else:
            M[d] = f
    if "N" in c:
        N = _bound(c["N"], dom, f"{path}.N")
    else:
        N = dom.empty if isinstance(dom, SeqDomain) else f
    phi_values: dict[str, Bound] = {}
    for e, edge in outs.items():
        if edge.phi != "recorded":
            continue
        dst = domains[edge.dst]
        if e in c.get("phi", {}):
            phi_values[e] = _bound(c["phi"][e], dst, f"{path}.phi.{e}")
        elif f == dom.empty:
            phi_values[e] = dst.empty
        elif is_top:
            phi_values[e] = dst.top
        else:
            raise ScenarioError(f"{path}.phi.{e}: edge {e!r} is recorded: give φ's value at this checkpoint")
    D = {}
    for e, edge in outs.items():
        dst = domains[edge.dst]
        if e in c.get("D", {}):
            D[e] = _bound(c["D"][e], dst, f"{path}.D.{e}")
        elif edge.phi == "recorded":
            D[e] = dst.top if is_top else phi_values[e]
        else:
            D[e] = phis[e].apply(f)
    return Checkpoint(f=f, M=M, N=N, D=D, phi=phi_values)


def _only_edge(dom: SeqDomain, d: str, f: Bound) -> Bound:
    """The seq frontier that counts only edge ``d``'s messages of ``f`` (M̄(d, f) in seq domains)."""
    return tuple(x if j == dom.index[d] else 0 for j, x in enumerate(f[:-1])) + (0,)


def _domains(procs: list[dict], edges: list[Edge], ids: Mapping[str, int]) -> dict[str, Domain]:
    """Each processor's domain; a lex tuple length is read from the frontiers written in it."""
    lengths: dict[str, int] = {}

    def note(pid: str, value: Any, path: str) -> None:
        if isinstance(value, dict) and len(value) == 1:
            (form, arg), = value.items()
            if form in ("through", "below") and isinstance(arg, list):
                known = lengths.setdefault(pid, len(arg))
                _require(known == len(arg), path,
                         f"lex tuples of processor {pid!r} have {known} coordinates elsewhere, here {len(arg)}")

    out_dst = {e.id: e.dst for e in edges}
    for i, p in enumerate(procs):
        if p["domain"] != "lex":
            continue
        for k, c in enumerate(p["checkpoints"]):
            if not isinstance(c, dict):
                continue
            base = f"processors[{i}].checkpoints[{k}]"
            note(p["id"], c.get("frontier"), f"{base}.frontier")
            note(p["id"], c.get("N"), f"{base}.N")
            for d, v in (c.get("M") or {}).items() if isinstance(c.get("M"), dict) else []:
                note(p["id"], v, f"{base}.M.{d}")
    for i, p in enumerate(procs):  # D and phi values are written in the receiver's domain
        for k, c in enumerate(p["checkpoints"]):
            if not isinstance(c, dict):
                continue
            for key in ("D", "phi"):
                for e, v in (c.get(key) or {}).items() if isinstance(c.get(key), dict) else []:
                    dst = out_dst.get(e)
                    if dst is not None and procs[ids[dst]]["domain"] == "lex":
                        note(dst, v, f"processors[{i}].checkpoints[{k}].{key}.{e}")
    # A lex processor written only with "empty"/"top" takes its length across identity/feedback edges.
    changed = True
    while changed:
        changed = False
        for e in edges:
            a, b = e.src, e.dst
            if procs[ids[a]]["domain"] == procs[ids[b]]["domain"] == "lex" and e.phi in ("identity", "feedback"):
                for x, y in ((a, b), (b, a)):
                    if x in lengths and y not in lengths:
                        lengths[y] = lengths[x]
                        changed = True
    domains: dict[str, Domain] = {}
    for p in procs:
        if p["domain"] == "epoch":
            domains[p["id"]] = EPOCH
        elif p["domain"] == "lex":
            domains[p["id"]] = LexDomain(lengths.get(p["id"], 1))
        else:
            domains[p["id"]] = SeqDomain([e.id for e in edges if e.dst == p["id"]])
    return domains


def _new_id(obj: Any, path: str, keys: set[str], kind: str, seen: Mapping[str, int]) -> str:
    """Check one processor or edge object (its keys, its id, that the id is new); return the id."""
    _require(isinstance(obj, dict), path, "must be an object")
    _unknown_keys(obj, keys, path)
    oid = obj.get("id")
    _require(isinstance(oid, str) and oid != "", f"{path}.id", "is required (a non-empty string)")
    _require(oid not in seen, f"{path}.id", f"duplicate {kind} id {oid!r}")
    return oid


def _bound(value: Any, dom: Domain, path: str) -> Bound:
    try:
        return parse_bound(value, dom)
    except NotationError as exc:
        raise ScenarioError(f"{path}: {exc}") from None


def _unknown_keys(obj: Mapping[str, Any], allowed: set[str], path: str) -> None:
    for key in obj:
        if key not in allowed:
            raise ScenarioError(f"{path}.{key}: unknown key; allowed keys are {', '.join(sorted(allowed))}"
                                if path != "(top level)" else
                                f"{key}: unknown key; allowed keys are {', '.join(sorted(allowed))}")


def _require(condition: bool, path: str, message: str) -> None:
    if not condition:
        raise ScenarioError(f"{path}: {message}")
