"""Checkpoint metadata Ξ(p, f) and the chain F*(p) it forms (Falkirk Wheel §3.4, Table 1).

For a checkpoint at frontier f of processor p:

* ``M[d]`` = M̄(d, f): the times of messages p consumed from input edge d (p's domain);
* ``N``    = N̄(p, f): the notifications p processed (p's domain);
* ``D[e]`` = D̄(e, f): the times of messages p sent on output edge e but did not log
  (the receiver's domain);
* ``phi[e]`` = φ(e)(f) where φ depends on history (the receiver's domain).

:class:`Chain` holds F*(p), ascending, and checks the invariants the solver's
correctness rests on: ∅ first with empty metadata, strictly ascending frontiers,
metadata that never shrinks along the chain, M̄ ⊆ f and N̄ ⊆ f, and ⊤ only last and
only for a live processor.

>>> from falkirk.policies.rollback.times import EPOCH
>>> chain = Chain(EPOCH, [Checkpoint(0, {"e": 0}, 0, {}), Checkpoint(3, {"e": 3}, 0, {})])
>>> [c.f for c in chain], chain.has_top
([0, 3], False)
>>> Chain(EPOCH, [Checkpoint(0, {}, 0, {}), Checkpoint(3, {"e": 5}, 0, {})], in_domains={"e": EPOCH})
Traceback (most recent call last):
...
falkirk.policies.rollback.metadata.MetadataError: checkpoints[1].M.e: M̄ must lie within the checkpoint's frontier (M̄ ⊆ f)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from falkirk.policies.rollback.times import Bound, Domain, SeqDomain


class MetadataError(ValueError):
    """Checkpoint metadata that breaks an invariant; the message starts with the field's path."""


@dataclass(frozen=True)
class Checkpoint:
    """Ξ(p, f): one element of F*(p), as bounds (see :mod:`falkirk.policies.rollback.times`).

    A bar that is absent (an edge missing from ``M`` or ``D``, ``N`` of ``None``) adds no
    constraint; :mod:`falkirk.policies.rollback.scenario` fills in the format's defaults before this point.
    """

    f: Bound
    M: Mapping[str, Bound] = field(default_factory=dict)
    N: Bound = None
    D: Mapping[str, Bound] = field(default_factory=dict)
    phi: Mapping[str, Bound] = field(default_factory=dict)


class Chain:
    """F*(p): the ascending chain of checkpoints p can roll back to.

    ``in_domains`` is p's domain per input edge (all p's own) and ``out_domains`` the
    receiver's domain per output edge; given, they let the chain check every invariant.
    """

    def __init__(
        self,
        domain: Domain,
        checkpoints: list[Checkpoint],
        *,
        in_domains: Mapping[str, Domain] | None = None,
        out_domains: Mapping[str, Domain] | None = None,
        failed: bool = False,
    ) -> None:
        self.domain = domain
        self.checkpoints = list(checkpoints)
        self.out_domains = dict(out_domains or {})
        self.failed = failed
        self._check(in_domains)

    def __iter__(self) -> Iterator[Checkpoint]:
        return iter(self.checkpoints)

    def __len__(self) -> int:
        return len(self.checkpoints)

    def __getitem__(self, i: int) -> Checkpoint:
        return self.checkpoints[i]

    @property
    def has_top(self) -> bool:
        return bool(self.checkpoints) and self.checkpoints[-1].f == self.domain.top

    def without_top(self) -> Chain:
        """The persisted checkpoints only: what a failed processor, or the monitor, sees."""
        kept = self.checkpoints[:-1] if self.has_top else self.checkpoints
        chain = Chain.__new__(Chain)
        chain.domain, chain.checkpoints, chain.out_domains, chain.failed = self.domain, kept, self.out_domains, self.failed
        return chain

    def copy(self) -> Chain:
        """The same chain in a list of its own: appending to one leaves the other as it was."""
        chain = Chain.__new__(Chain)
        chain.domain, chain.checkpoints, chain.out_domains, chain.failed = (
            self.domain, list(self.checkpoints), self.out_domains, self.failed)
        return chain

    def append(self, checkpoint: Checkpoint) -> None:
        """Add a new largest checkpoint (before ⊤, if the chain ends with ⊤), checking the invariants."""
        if self.has_top:
            self.checkpoints.insert(len(self.checkpoints) - 1, checkpoint)
        else:
            self.checkpoints.append(checkpoint)
        try:
            self._check(None)
        except MetadataError:
            self.checkpoints.remove(checkpoint)
            raise

    def _check(self, in_domains: Mapping[str, Domain] | None) -> None:
        dom = self.domain
        cps = self.checkpoints
        if not cps:
            raise MetadataError("checkpoints: F*(p) needs at least the empty checkpoint")
        first = cps[0]
        if first.f != dom.empty:
            raise MetadataError("checkpoints[0].frontier: the first checkpoint must be ∅ (\"empty\")")
        for i, c in enumerate(cps):
            path = f"checkpoints[{i}]"
            if c.f == dom.top and i != len(cps) - 1:
                raise MetadataError(f"{path}.frontier: \"top\" may only be the last checkpoint")
            if c.f == dom.top and self.failed:
                raise MetadataError(f"{path}.frontier: a failed processor has no \"top\" checkpoint")
            if i > 0 and not (dom.subset(cps[i - 1].f, c.f) and cps[i - 1].f != c.f):
                raise MetadataError(f"{path}.frontier: checkpoints must strictly ascend")
            if c.N is not None and not dom.subset(c.N, c.f):
                raise MetadataError(f"{path}.N: N̄ must lie within the checkpoint's frontier (N̄ ⊆ f)")
            for d, m in c.M.items():
                if not dom.subset(m, c.f):
                    raise MetadataError(f"{path}.M.{d}: M̄ must lie within the checkpoint's frontier (M̄ ⊆ f)")
                if isinstance(dom, SeqDomain) and d in dom.index and any(
                        x for j, x in enumerate(m[:-1]) if j != dom.index[d]):
                    raise MetadataError(f"{path}.M.{d}: a seq M̄(d, f) may count only edge {d}")
            if i == 0:
                bars: list[tuple[str, Any, Domain | None]] = [(f"M.{d}", m, dom) for d, m in c.M.items()]
                bars.append(("N", c.N, dom))
                bars += [(f"D.{e}", v, self.out_domains.get(e)) for e, v in c.D.items()]
                bars += [(f"phi.{e}", v, self.out_domains.get(e)) for e, v in c.phi.items()]
                for name, value, bar_domain in bars:
                    if bar_domain is not None and value is not None and value != bar_domain.empty:
                        raise MetadataError(f"{path}.{name}: the metadata of ∅ must be ∅")
                continue
            prev = cps[i - 1]
            checks: list[tuple[str, Any, Any, Domain | None]] = [(f"M.{d}", prev.M.get(d), c.M.get(d), dom)
                                                                 for d in c.M]
            checks.append(("N", prev.N, c.N, dom))
            checks += [(f"D.{e}", prev.D.get(e), c.D.get(e), self.out_domains.get(e)) for e in c.D]
            if c.f != dom.top:  # φ(⊤) = ⊤ whatever is stored
                checks += [(f"phi.{e}", prev.phi.get(e), c.phi.get(e), self.out_domains.get(e)) for e in c.phi]
            for name, before, now, check_domain in checks:
                if check_domain is None or before is None or now is None:
                    continue
                if not check_domain.subset(before, now):
                    raise MetadataError(f"{path}.{name}: metadata must not shrink along the chain "
                                        f"(it is smaller than at checkpoints[{i - 1}])")
