"""Rebuilding a task's state from the blocks its producers retain, or naming what is lost.

A task under sender-side logs checkpoints no state. Its state after epoch ``t`` depends, on each
input, only on the blocks after that input's release point (:mod:`.release`), and a producer
prunes a block only once the slice sinks have acknowledged it, which they do only after the
task released it. So a new incarnation rebuilds the state from empty by replaying, on every
input in seq order, each block retained after the edge's prune point, as the paper's restarted
vertex does: blocks it had processed before are processed again, and what they produce is sent
again and discarded downstream by (origin, seq). That is possible while every one of those
blocks is retained; a block lost with a producer's volatile log, or pruned after a release
declared too early, makes the state unrecoverable, and the rebuild is refused by name instead
of producing a wrong result (Smith & Watson, CS-TR-836 §IV.C: a log lost with a failed vertex).

>>> plan = rebuild("total", 8, pruned={"ingest": 0}, retained={"ingest": range(1, 9)})
>>> plan.replay, plan.blocks
((('ingest', (1, 2, 3, 4, 5, 6, 7, 8)),), 8)
>>> rebuild("v3", 7, pruned={"v2": 0}, retained={"v2": [6, 7]})
Traceback (most recent call last):
...
falkirk.policies.sender_logs.rebuild.BlocksLost: v3 epoch 7: unrecoverable: required blocks 1-5 of origin v2 missing (pruned, or lost with v2's volatile log); not rebuilding its state without them
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from falkirk.policies.epochs import epoch_ranges


class BlocksLost(RuntimeError):
    """Blocks a state depends on are no longer retained: the state cannot be rebuilt."""


@dataclass(frozen=True)
class Rebuild:
    """What a new incarnation of ``task`` replays to rebuild its state after epoch ``through``:
    per input, the blocks after its edge's prune point, in seq order."""

    task: str
    through: int
    replay: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def blocks(self) -> int:
        """How many blocks the rebuild reads."""
        return sum(len(seqs) for _, seqs in self.replay)


def rebuild(task: str, through: int, pruned: Mapping[str, int],
            retained: Mapping[str, Iterable[int]]) -> Rebuild:
    """The replay that rebuilds ``task``'s state after epoch ``through``: per input, every block
    after the edge's prune point ``pruned[input]`` (the newest seq all its slice sinks have
    acknowledged); raises :class:`BlocksLost` naming every block of them the edge no longer
    ``retained``, with its origin."""
    replay = []
    lost = []
    for source in sorted(pruned):
        needed = range(pruned[source] + 1, through + 1)
        held = set(retained.get(source, ()))
        missing = [s for s in needed if s not in held]
        if missing:
            lost.append(f"required blocks {epoch_ranges(missing)} of origin {source} missing (pruned, or lost with "
                        f"{source}'s volatile log)")
        replay.append((source, tuple(needed)))
    if lost:
        raise BlocksLost(f"{task} epoch {through}: unrecoverable: {'; '.join(lost)}; not rebuilding its state "
                         f"without them")
    return Rebuild(task, through, tuple(replay))


__all__ = ["BlocksLost", "Rebuild", "rebuild"]
