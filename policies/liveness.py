"""Failure detection: a worker is lost when it has not answered for ``timeout`` seconds.

The watcher (:mod:`falkirk.plugins.watch`) asks the workers for a heartbeat every few seconds
(Celery's ping) and feeds the answers here. A worker that has answered once and then stays
silent for longer than ``timeout`` is declared lost, once per silence; a configured worker
never heard from is declared lost ``timeout`` after the watch began. So the time to notice a
lost worker is bounded by ``timeout`` plus one poll. A lost worker that answers again is a new
machine under the name (or the old one back): lost again, it is declared again.

>>> beats = Heartbeats(["w0", "w1"], timeout=10, started=0)
>>> beats.heard(["w0", "w1"], at=1); beats.heard(["w0"], at=8); beats.lost(at=9)
[]
>>> beats.heard(["w0"], at=12); beats.lost(at=12)
['w1']
>>> beats.lost(at=20)  # declared once
[]
>>> beats.heard(["w0", "w1"], at=30); beats.lost(at=45)  # w1 came back, then went silent again
['w0', 'w1']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class Heartbeats:
    """When each worker answered last, and which ones are lost (see the module docstring)."""

    def __init__(self, workers: Sequence[str], timeout: float, started: float) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout={timeout!r}: give the seconds of silence after which a worker is lost (> 0)")
        self.timeout = timeout
        self.last = {w: started for w in workers}
        self.declared: set[str] = set()

    def heard(self, workers: Iterable[str], at: float) -> None:
        """Workers that answered at ``at``. A declared worker that answers again is a new worker
        (its replicas stay dead): noted as alive, and declared again if it falls silent."""
        for w in workers:
            self.last[w] = at
            self.declared.discard(w)

    def lost(self, at: float) -> list[str]:
        """The workers silent for longer than ``timeout`` at ``at``, not declared before."""
        out = sorted(w for w, t in self.last.items() if at - t > self.timeout and w not in self.declared)
        self.declared |= set(out)
        return out


__all__ = ["Heartbeats"]
