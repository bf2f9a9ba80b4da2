"""From what running processors record to a rollback question (Falkirk Wheel §3.4-3.5, Table 1).

A processor that checkpoints records Ξ(p, f) next to each checkpoint: the frontier f and
the bars M̄, N̄, D̄ as it knows them at that moment. A live processor also records the Ξ of
⊤, its current state; one that checkpoints after every event needs no such record, its ⊤
carries the metadata of its latest checkpoint. :func:`scenario_from_records` assembles
these into a ``falkirk-scenario/1`` document (F*(p) = ∅, the checkpoints in time order,
and ⊤ unless p failed), so the solver answers for a running system exactly as it answers
for a hand-written scenario, and the document can be saved and read by a person.

Frontiers and bars use the scenario format's notation (``"empty"``, ``{"through": [1, 4]}``).

>>> records = [XiRecord("u", 0, D={"e": {"through": 0}}), XiRecord("u", 1, D={"e": {"through": 1}}),
...            XiRecord("v", 0, M={"e": {"through": 0}})]
>>> doc = scenario_from_records("tiny", {"u": "epoch", "v": "epoch"},
...                            [{"id": "e", "src": "u", "dst": "v", "phi": "identity"}], records, failed={"v"})
>>> [c["frontier"] for c in doc["processors"][0]["checkpoints"]]
['empty', {'through': 0}, {'through': 1}, 'top']
>>> rollback_times(doc)
{'u': 0, 'v': 0}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from falkirk.policies.rollback.scenario import FORMAT, load_scenario

Time = Any  # int (epoch) or tuple of ints (lex)
TOP = "top"


@dataclass(frozen=True)
class XiRecord:
    """Ξ(p, f) as p recorded it: at the checkpoint ``through`` time ``time``, or at ⊤ when
    ``time`` is ``None`` (a live processor's current state)."""

    processor: str
    time: Time | None
    M: Mapping[str, Any] = field(default_factory=dict)
    N: Any = "empty"
    D: Mapping[str, Any] = field(default_factory=dict)

    def entry(self) -> dict[str, Any]:
        """This record as one checkpoint of a scenario document."""
        frontier = TOP if self.time is None else {"through": _notation(self.time)}
        entry: dict[str, Any] = {"frontier": frontier, "N": self.N}
        if self.M:
            entry["M"] = dict(self.M)
        if self.D:
            entry["D"] = dict(self.D)
        return entry


def scenario_from_records(name: str, processors: Mapping[str, str], edges: list[dict], records: Iterable[XiRecord],
                          failed: Iterable[str] = ()) -> dict[str, Any]:
    """The scenario document of ``processors`` (id -> domain) and ``edges`` given their records.

    A failed processor's ⊤ is left out (its state is lost); a live one's is its latest
    ``time=None`` record, or else its latest checkpoint's Ξ at ⊤.
    """
    failed = set(failed)
    unknown = failed - set(processors)
    if unknown:
        raise ValueError(f"failed: {sorted(unknown)} are not processors of {name!r}; they are {sorted(processors)}")
    by_processor: dict[str, list[XiRecord]] = {p: [] for p in processors}
    for r in records:
        if r.processor not in by_processor:
            raise ValueError(f"record of {r.processor!r}: not a processor of {name!r}; they are {sorted(processors)}")
        by_processor[r.processor].append(r)
    docs = []
    for pid, domain in processors.items():
        checkpoints = sorted((r for r in by_processor[pid] if r.time is not None), key=lambda r: _key(r.time))
        live = [r for r in by_processor[pid] if r.time is None]
        chain = [{"frontier": "empty"}] + [r.entry() for r in checkpoints]
        if pid not in failed:
            top = live[-1] if live else (checkpoints[-1] if checkpoints else XiRecord(pid, None))
            chain.append(XiRecord(pid, None, top.M, top.N, top.D).entry())
        docs.append({"id": pid, "domain": domain, "failed": pid in failed, "checkpoints": chain})
    return {"format": FORMAT, "name": name, "notifications": True, "processors": docs, "edges": list(edges)}


def rollback_times(doc: Mapping[str, Any]) -> dict[str, Time | None]:
    """Solve the document: each processor's chosen frontier as its last time (``through``),
    ``"top"`` to keep going from where it is, or ``None`` to start from nothing."""
    answer = load_scenario(doc).answer()
    times: dict[str, Time | None] = {}
    for pid, chosen in answer["frontiers"].items():
        frontier = chosen["frontier"]
        if frontier == TOP:
            times[pid] = TOP
        elif frontier == "empty":
            times[pid] = None
        else:
            through = frontier["through"]
            times[pid] = tuple(through) if isinstance(through, list) else through
    return times


def _notation(time: Time) -> Any:
    return list(time) if isinstance(time, tuple) else time


def _key(time: Time) -> tuple:
    return tuple(time) if isinstance(time, (tuple, list)) else (time,)
