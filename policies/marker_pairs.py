"""Marker pairs: when a transactional sink may commit what a non-deterministic producer sent.

A process that commits to a transactional target (a warehouse table) may commit only data
whose determinants are saved, so that a replay reproduces it (Ertel, Fetzer, Beckerle, Fast Travellers). The
producer says so with a marker, and the marker must travel *in order* with the data (a slow
traveller, ``st``) to be correct; but with bounded buffers (a transaction holds at most
``capacity`` rows) the data ahead of an ``st`` can fill the sink before the ``st`` arrives:
deadlock. A **marker pair** fixes both: a fast traveller ``ft`` goes out of band into a slot
every buffer keeps free for it, and enables commits of everything received until its ``st``
arrives, which only evicts it.

This module is the protocol, with no I/O:

* :class:`MarkerGate`: the sink's side, which a runtime uses on its own. It holds the open
  transaction (at most ``capacity`` messages, one slot reserved for an ``ft`` in pair mode)
  and answers what may be committed now. Markers carry increasing ids; a newer ``ft``
  supersedes an older one in the slot; an ``st`` evicts only an ``ft`` whose id is no
  greater than its own; an ``st`` that arrives before its ``ft`` commits in the classical way
  (everything before it), and that ``ft`` is then ignored (Fast Travellers, "Correctness" and "Marker Pairs").
* :func:`simulate`: a bounded pipeline, P (a non-deterministic source) → R
  (an enricher, ``fanout`` messages per item) → Q (the sink, a :class:`MarkerGate`), round by
  round, with an oracle that checks each commit against the markers created so far.

>>> outcome = simulate(Scenario(mode="slow"))
>>> outcome.deadlocked, len(outcome.committed)
(True, 0)
>>> outcome = simulate(Scenario(mode="pairs"))
>>> outcome.deadlocked, len(outcome.committed), outcome.violations
(False, 24, [])
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["slow", "pairs"]


@dataclass(frozen=True)
class Data:
    """A data message. ``origin`` is the source item it derives from: only the oracle reads it."""

    name: str
    origin: int

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class SlowTraveller:
    """Marker ``marker``, in band: everything sent before it can be replayed."""

    marker: int

    def __repr__(self) -> str:
        return f"st{self.marker}"


@dataclass(frozen=True)
class FastTraveller:
    """Marker ``marker``, out of band: sent with its slow traveller, overtaking the data."""

    marker: int

    def __repr__(self) -> str:
        return f"ft{self.marker}"


Message = Data | SlowTraveller


class ProtocolError(ValueError):
    """A capacity or message the protocol cannot work with; the message names it and the fix."""


class MarkerGate:
    """The sink's buffer and commit rule (see the module docstring).

    ``capacity`` is the largest open transaction, counting the reserved slot in pair mode
    (so at most ``capacity - 1`` data messages wait there). ``evict_on_st=False`` is a bug,
    for tests: the ``st`` then leaves a stale ``ft`` in the slot.

    >>> gate = MarkerGate(capacity=3, mode="pairs")
    >>> gate.offer(Data("d1", 1)), gate.offer(Data("d2", 1)), gate.offer(Data("d3", 2))
    (True, True, False)
    >>> gate.committable()
    []
    >>> gate.fast(FastTraveller(1)); gate.committable()
    [d1, d2]
    >>> gate.commit()
    [d1, d2]
    >>> gate.offer(SlowTraveller(1)), gate.slot is None   # st1 evicts ft1
    (True, True)
    """

    def __init__(self, capacity: int, mode: Mode = "pairs", evict_on_st: bool = True) -> None:
        if mode not in ("slow", "pairs"):
            raise ProtocolError(f"mode={mode!r}: 'slow' (slow travellers only) or 'pairs' (marker pairs)")
        least = 2 if mode == "pairs" else 1
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < least:
            raise ProtocolError(f"capacity={capacity!r}: at least {least} in {mode} mode"
                                + (" (one data slot and the slot kept free for a fast traveller)"
                                   if mode == "pairs" else ""))
        self.capacity, self.mode, self.evict_on_st = capacity, mode, evict_on_st
        self.buffer: deque[Message | _Covered] = deque()  # data an st covered is kept as _Covered
        self.slot: FastTraveller | None = None  # the reserved slot (pair mode)
        self.last_st = 0  # the newest slow traveller received
        self.enabled = False  # an ft is in the slot: what arrives before its st is committable

    @property
    def room(self) -> int:
        """Messages the open transaction can still take in band."""
        return self.capacity - (1 if self.mode == "pairs" else 0) - len(self.buffer)

    def offer(self, message: Message) -> bool:
        """Take ``message`` in band if there is room; ``False`` leaves it with the sender."""
        if self.room <= 0:
            return False
        if isinstance(message, SlowTraveller) and self.mode == "pairs":
            # st_k: everything before it is covered; it evicts an ft no newer than itself and is consumed
            self._cover_before_end()
            self.last_st = max(self.last_st, message.marker)
            if self.evict_on_st and self.slot is not None and self.slot.marker <= message.marker:
                self.slot, self.enabled = None, False
            return True
        self.buffer.append(message)
        return True

    def fast(self, ft: FastTraveller) -> None:
        """Receive ``ft`` out of band into the reserved slot (slow mode: there is no slot; ignored)."""
        if self.mode != "pairs" or ft.marker <= self.last_st:
            return  # its st came first: classical semantics already covered that data
        if self.slot is None or ft.marker > self.slot.marker:
            self.slot, self.enabled = ft, True

    def committable(self) -> list[Data]:
        """The data messages that may be committed now, oldest first."""
        if self.mode == "pairs" and self.enabled:
            return [m for m in self.buffer if isinstance(m, Data)]
        out: list[Data] = []
        pending: list[Data] = []
        for m in self.buffer:  # data followed by an st in the buffer (and data marked covered)
            if isinstance(m, SlowTraveller):
                out += pending
                pending = []
            elif isinstance(m, _Covered):
                out.append(m.data)
            else:
                pending.append(m)
        return out

    def commit(self) -> list[Data]:
        """Commit what is committable (one transaction); returns it, in order."""
        done = self.committable()
        if not done:
            return []
        keep: deque[Message | _Covered] = deque()
        committed = {id(d) for d in done}
        for m in self.buffer:
            if isinstance(m, SlowTraveller) and self.mode == "slow":
                # consumed once the data before it is committed
                if not any(isinstance(k, (Data, _Covered)) for k in keep):
                    self.last_st = max(self.last_st, m.marker)
                    continue
            data = m.data if isinstance(m, _Covered) else m
            if isinstance(data, Data) and id(data) in committed:
                continue
            keep.append(m)
        self.buffer = keep
        return done

    def forget_after(self, origin: int) -> int:
        """Drop the buffered data derived after ``origin`` (a producer attempt died and its
        successor sends that data anew, drawn again), and the markers of those later origins:
        a fast traveller in the slot for one of them vouches for nothing the successor sends.
        Returns how many data messages were dropped. Covered data is never dropped: an st
        vouched for it.

        >>> gate = MarkerGate(capacity=4)
        >>> _ = [gate.offer(Data(n, o)) for n, o in (("a", 1), ("b", 2), ("c", 2))]
        >>> gate.forget_after(1), list(gate.buffer)
        (2, [a])

        A redo of the whole epoch keeps nothing; the first attempt's ft of origin 2 goes with it,
        and the redo's data waits for its own markers:

        >>> gate.fast(FastTraveller(2)); gate.forget_after(0), gate.slot
        (1, None)
        >>> gate.offer(Data("a'", 1)), gate.committable()
        (True, [])
        """
        before = len(self.buffer)
        self.buffer = deque(m for m in self.buffer if not (isinstance(m, Data) and m.origin > origin))
        if self.slot is not None and self.slot.marker > origin:
            self.slot, self.enabled = None, False
        self.last_st = min(self.last_st, origin)
        return before - len(self.buffer)

    def _cover_before_end(self) -> None:
        self.buffer = deque(_Covered(m) if isinstance(m, Data) else m for m in self.buffer)


@dataclass(frozen=True)
class _Covered:
    """A data message an st has covered (pair mode, after an early st): committable."""

    data: Data


@dataclass(frozen=True)
class Scenario:
    """The bounded pipeline and its knobs."""

    items: int = 8  # data items P emits
    fanout: int = 3  # messages R derives from each item
    marker_every: int = 2  # P creates marker k after item marker_every * k
    out_p: int = 2  # |O_P|
    in_r: int = 2  # |I_R| (one slot reserved in pair mode)
    out_r: int = 3  # |O_R|
    in_q: int = 4  # |I_Q|, the largest transaction (one slot reserved in pair mode)
    mode: Mode = "pairs"
    determinant_delay: int = 0  # rounds from item marker_every * k to marker k (its determinants saved)
    evict_on_st: bool = True  # False: a bug, the oracle must catch it
    max_rounds: int = 10_000


@dataclass
class Outcome:
    """What a run did: every commit, each checked by the oracle, and where it got stuck if it did."""

    committed: list[Data] = field(default_factory=list)
    violations: list[tuple[Data, int]] = field(default_factory=list)  # (message, markers created then)
    deadlocked: bool = False
    rounds: int = 0
    # at a deadlock: each buffer's contents and what R holds
    stuck: dict[str, list[str]] = field(default_factory=dict)
    # what happened at the sink, in order: "ft2 in Q's slot", "commit d3.1 d3.2", "st1 at Q"
    log: list[str] = field(default_factory=list)
    emitted: int = 0  # items the source emitted
    created: int = 0  # markers it created


def simulate(s: Scenario) -> Outcome:
    """Run ``s`` round by round until every message is committed or nothing can move (deadlock).

    In each round Q commits and takes in what it can, R forwards or derives one message, and P
    emits one; a marker's ft goes out of band at once, through R's reserved slot into Q's.
    The oracle: a commit of a message derived from item ``i`` is valid iff
    ``i <= marker_every * k`` for a marker ``k`` already created.
    """
    pairs = s.mode == "pairs"
    if s.in_r < (2 if pairs else 1):
        raise ProtocolError(f"in_r={s.in_r}: at least {2 if pairs else 1} in {s.mode} mode")
    q = MarkerGate(s.in_q, s.mode, s.evict_on_st)
    out_p: deque[Message] = deque()
    in_r: deque[Message] = deque()
    out_r: deque[Message] = deque()
    in_r_room = s.in_r - (1 if pairs else 0)
    emitted = created = 0
    wait = 0  # rounds P still waits for the determinants of its next marker
    st_waiting: SlowTraveller | None = None  # a created marker's st, until O_P has room for it
    holding: tuple[Data, int] | None = None  # R: the item it derives from, and how many it has sent
    out = Outcome()
    total = s.items * s.fanout
    markers = s.items // s.marker_every
    for round_ in range(1, s.max_rounds + 1):
        moved = False
        # Q: commit, then take one message in band
        done = q.commit()
        for d in done:
            out.committed.append(d)
            if d.origin > s.marker_every * created:
                out.violations.append((d, created))
            moved = True
        if done:
            out.log.append("commit " + " ".join(d.name for d in done))
        if out_r and q.offer(out_r[0]):
            if isinstance(out_r[0], SlowTraveller):
                out.log.append(f"{out_r[0]!r} at Q")
            out_r.popleft()
            moved = True
        # R: forward an st, or derive the next message of its item, or take the next one in
        if holding is not None:
            item, sent = holding
            if len(out_r) < s.out_r:
                out_r.append(Data(f"{item.name}.{sent + 1}", item.origin))
                holding = (item, sent + 1) if sent + 1 < s.fanout else None
                moved = True
        elif in_r:
            head = in_r[0]
            if isinstance(head, SlowTraveller):
                if len(out_r) < s.out_r:
                    out_r.append(in_r.popleft())
                    moved = True
            else:
                holding = (head, 0)
                in_r.popleft()
                moved = True
        if out_p and len(in_r) < in_r_room:
            in_r.append(out_p.popleft())
            moved = True
        # P: create the next marker once its items' determinants are saved (its ft leaves at once,
        # out of band, through R's reserved slot into Q's); its st goes in band, before any later item
        due = created < markers and emitted >= s.marker_every * (created + 1)
        if due and wait > 0:
            wait -= 1
            moved = True
        elif due:
            created += 1
            st_waiting = SlowTraveller(created)
            if pairs:
                q.fast(FastTraveller(created))
                out.log.append(f"ft{created} in Q's slot")
            moved = True
        if st_waiting is not None and len(out_p) < s.out_p:
            out_p.append(st_waiting)
            st_waiting = None
            moved = True
        elif st_waiting is None and not due and emitted < s.items and len(out_p) < s.out_p:
            emitted += 1
            out_p.append(Data(f"d{emitted}", emitted))
            wait = s.determinant_delay if emitted % s.marker_every == 0 else wait
            moved = True
        out.rounds, out.emitted, out.created = round_, emitted, created
        if len(out.committed) == total:
            return out
        if not moved:
            out.deadlocked = True
            out.stuck = {"I_Q": [repr(m if not isinstance(m, _Covered) else m.data) for m in q.buffer],
                         "O_R": [repr(m) for m in out_r], "R": [holding[0].name] if holding else [],
                         "I_R": [repr(m) for m in in_r], "O_P": [repr(m) for m in out_p]}
            return out
    raise ProtocolError(f"max_rounds={s.max_rounds}: the run neither finished nor stopped moving; raise it")


def boundary(mode: Mode, capacities: Iterable[int], **knobs: object) -> dict[int, bool]:
    """Per sink capacity |I_Q|, whether the scenario completes (the last rows of docs/howto/marker-pairs.md's table).

    >>> boundary("slow", range(4, 9))
    {4: False, 5: False, 6: False, 7: True, 8: True}
    """
    return {c: not simulate(Scenario(mode=mode, in_q=c, **knobs)).deadlocked for c in capacities}  # type: ignore[arg-type]
