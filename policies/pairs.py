"""Process pairs: the layout of a replicated task's partitions, and every decision made from it.

A task under process pairs runs each partition twice, as replicas ``A`` and ``B`` on two
different workers. The **layout** records, per (task, partition, replica), the worker, the
status, the state version the replica has committed and its **generation**:

* ``ACTIVE``: alive and processing; ``DEAD``: out of the dataflow for good (a worker that comes
  back re-enters as a new standby); ``STDBY``: a replacement catching up to its survivor, which
  pins the garbage collection of what it still has to read.
* A take-over (:meth:`Layout.fail`) marks every replica on a lost worker ``DEAD`` and raises its
  generation, so that a late commit of the old incarnation (a zombie) is fenced
  (:meth:`Layout.admits`); nothing re-runs, and consumers read the survivor instead
  (:meth:`Layout.source`), their own replica id first.
* A catch-up registers a standby on a spare at the survivor's version (:meth:`Layout.register`),
  and folds it in once its version equals the survivor's (:meth:`Layout.fold_in`); bottom-up
  across levels (:func:`catch_up_order`). A failure during catch-up discards the standby
  (:meth:`Layout.discard`).
* Both replicas of a partition lost: :meth:`Layout.source` answers ``None`` and
  :meth:`Layout.lost_partitions` names the partition: the epoch must not be emitted without it;
  the durable path (restore the partition's last durable state and re-execute it alone) takes over.

Pure: the layout is a value, each transition returns a new one. The store keeps it in a control
table; Airflow's side (failure detection, catch-up tasks) acts on what these functions decide.

>>> layout = chained({"sessions": 4, "stats": 4}, ["w0", "w1", "w2", "w3"])
>>> layout.replica("sessions", 0, "B").worker, layout.replica("sessions", 3, "B").worker
('w1', 'w0')
>>> after = layout.fail("w1")
>>> sorted(r.name for r in after.replicas if r.status is Status.DEAD)
['sessions[0].B', 'sessions[1].A', 'stats[0].B', 'stats[1].A']
>>> after.source("stats", 2, "A", "sessions", 1)  # stats[2].A reads partition 1 from its survivor
'B'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from falkirk.policies.ids import ReplicaId


class PairsError(ValueError):
    """A layout change that would break a process pair; the message names the fix."""


class Status(Enum):
    ACTIVE = "ACTIVE"
    DEAD = "DEAD"
    STDBY = "STDBY"


@dataclass(frozen=True, kw_only=True)
class Replica:
    """One replica of one partition of a paired task: where it runs and how far it got."""

    task: str
    partition: int
    replica: str
    worker: str
    status: Status = Status.ACTIVE
    version: int = 0  # the last epoch whose state it committed (0: none yet)
    generation: int = 0  # raised on every take-over and replacement: commits of an older one are fenced

    @property
    def id(self) -> ReplicaId:
        """Which replica this is, and the task instance (map index) it runs as.

        >>> Replica(task="stats", partition=1, replica="B", worker="w2").id.processor
        'stats[3]'
        """
        return ReplicaId(task=self.task, partition=self.partition, replica=self.replica)

    @property
    def name(self) -> str:
        """``task[p].R``, as logs and the view name it.

        >>> Replica(task="stats", partition=1, replica="B", worker="w2").name
        'stats[1].B'
        """
        return str(self.id)


@dataclass(frozen=True)
class Layout:
    """Every replica of the DAG's paired tasks; the newest record per (task, partition, replica)."""

    replicas: tuple[Replica, ...]

    def replica(self, task: str, partition: int, replica: str) -> Replica:
        for r in self.replicas:
            if (r.task, r.partition, r.replica) == (task, partition, replica):
                return r
        raise PairsError(f"{ReplicaId(task=task, partition=partition, replica=replica)}: no such replica; the layout has "
                         f"{sorted({r.task for r in self.replicas})} with replicas {list(ReplicaId.NAMES)}")

    def pair(self, task: str, partition: int) -> tuple[Replica, Replica]:
        """Both replicas of one partition, ``A`` first."""
        return self.replica(task, partition, "A"), self.replica(task, partition, "B")

    def on(self, worker: str) -> list[Replica]:
        """The live replicas (active or standby) a worker holds."""
        return [r for r in self.replicas if r.worker == worker and r.status is not Status.DEAD]

    def fail(self, worker: str) -> Layout:
        """The take-over when ``worker`` is lost: each of its live replicas is ``DEAD``, one
        generation on; nothing else changes (no re-run, no other partition touched).

        >>> layout = chained({"t": 2}, ["w0", "w1"]).fail("w0")
        >>> [(r.name, r.status.value, r.generation) for r in layout.replicas]
        [('t[0].A', 'DEAD', 1), ('t[0].B', 'ACTIVE', 0), ('t[1].A', 'ACTIVE', 0), ('t[1].B', 'DEAD', 1)]
        """
        if not self.on(worker):
            raise PairsError(f"worker {worker!r:.80} holds no live replica; workers holding some: "
                             f"{sorted({r.worker for r in self.replicas if r.status is not Status.DEAD})}")
        return self._replace({r: dataclasses.replace(r, status=Status.DEAD, generation=r.generation + 1)
                              for r in self.on(worker)})

    def fail_replica(self, task: str, partition: int, replica: str) -> Layout:
        """The take-over of one replica (its task instance failed, or its heartbeat timed out while
        its worker lives on): ``DEAD``, one generation on.

        >>> chained({"t": 2}, ["w0", "w1"]).fail_replica("t", 0, "B").replica("t", 0, "B").status.value
        'DEAD'
        """
        r = self.replica(task, partition, replica)
        if r.status is Status.DEAD:
            return self  # declared dead twice (a detector and a person): one take-over
        return self._replace({r: dataclasses.replace(r, status=Status.DEAD, generation=r.generation + 1)})

    def source(self, consumer_task: str, consumer_partition: int, consumer_replica: str, producer_task: str,
               producer_partition: int) -> str | None:
        """Which replica of ``producer_task[producer_partition]`` a consumer replica reads: its own
        replica id while that one is active, else the other; ``None`` when neither is active
        (the partition is lost: see :meth:`lost_partitions`). A standby consumer reads as its
        replica id would.

        >>> layout = chained({"g1": 2, "g2": 2}, ["w0", "w1"])
        >>> layout.source("g2", 0, "B", "g1", 1), layout.fail("w0").source("g2", 0, "B", "g1", 1)
        ('B', 'A')
        """
        self.replica(consumer_task, consumer_partition, consumer_replica)  # a known consumer
        own, other = consumer_replica, _other(consumer_replica)
        for candidate in (own, other):
            if self.replica(producer_task, producer_partition, candidate).status is Status.ACTIVE:
                return candidate
        return None

    def taken_over(self) -> list[str]:
        """The processors (``task[i]``, Airflow's map index) of dead replicas whose twin is alive:
        out of the dataflow, their partition held by the twin. A recovery plans without them (their
        missing epochs are not failures); a catch-up brings them back.

        >>> chained({"t": 2}, ["w0", "w1"]).fail_replica("t", 1, "A").taken_over()
        ['t[2]']
        """
        lost = set(self.lost_partitions())
        return sorted(r.id.processor for r in self.replicas
                      if r.status is Status.DEAD and (r.task, r.partition) not in lost)

    def lost_partitions(self) -> list[tuple[str, int]]:
        """(task, partition) pairs with no active replica: an epoch must not be emitted without
        them; the durable path restores and re-executes them alone.

        >>> chained({"t": 3}, ["w0", "w1", "w2"]).fail("w1").fail("w2").lost_partitions()
        [('t', 1)]
        """
        out = []
        for task, partition in sorted({(r.task, r.partition) for r in self.replicas}):
            if not any(r.status is Status.ACTIVE for r in self.pair(task, partition)):
                out.append((task, partition))
        return out

    def register(self, task: str, partition: int, spare: str, replaced: bool = False) -> Layout:
        """A catch-up begins: the dead replica of ``task[partition]`` is recreated on ``spare``
        as a standby at the survivor's committed version, one generation on. Its version pins
        garbage collection of the epochs after it (:meth:`gc_floor`).

        A lost worker is not a spare, unless ``replaced``: a new machine took its name (a
        StatefulSet pod, a host rebuilt under its hostname), and nothing of the old one runs.
        Should the old one still run, its replicas are dead a generation ago: their commits are
        fenced all the same.

        >>> layout = chained({"t": 2}, ["w0", "w1"]).fail("w1").register("t", 1, "w4")
        >>> r = layout.replica("t", 1, "A"); (r.worker, r.status.value, r.generation)
        ('w4', 'STDBY', 2)
        >>> chained({"t": 2}, ["w0", "w1"]).fail("w1").register("t", 1, "w1", replaced=True).replica("t", 1, "A").worker
        'w1'
        """
        dead, survivor = self._dead_and_survivor(task, partition)
        if spare == survivor.worker and len({r.worker for r in self.replicas}) > 1:
            raise PairsError(f"{ReplicaId.partition_name(task, partition)}: {spare} holds its survivor {survivor.name}; a pair needs two "
                             f"workers: choose another spare")
        if not replaced and spare in dead_workers(self):
            raise PairsError(f"{spare} was lost; a worker that comes back is a new spare under a new name, or, if a "
                             f"new machine took the name {spare} (its disk empty), say so: --spare {spare} --replaced")
        return self._replace({dead: dataclasses.replace(dead, worker=spare, status=Status.STDBY,
                                                        version=survivor.version, generation=dead.generation + 1)})

    def advance(self, task: str, partition: int, replica: str, version: int, generation: int) -> Layout:
        """A replica committed its state of epoch ``version`` under ``generation``: recorded, if
        :meth:`admits` the commit (a fenced zombie changes nothing)."""
        r = self.replica(task, partition, replica)
        if not self.admits(r, generation):
            return self
        if version < r.version:
            raise PairsError(f"{r.name}: version {version} is behind its committed {r.version}")
        return self._replace({r: dataclasses.replace(r, version=version)})

    def admits(self, replica: Replica, generation: int) -> bool:
        """Whether a commit made under ``generation`` counts: only the replica's current
        generation, and never a dead one's (a zombie's late commit is a no-op).

        >>> layout = chained({"t": 2}, ["w0", "w1"])
        >>> r = layout.replica("t", 1, "A")
        >>> layout.admits(r, 0), layout.fail("w1").admits(layout.fail("w1").replica("t", 1, "A"), 0)
        (True, False)
        """
        current = self.replica(replica.task, replica.partition, replica.replica)
        return current.status is not Status.DEAD and generation == current.generation

    def fold_in(self, task: str, partition: int) -> Layout:
        """The standby of ``task[partition]`` becomes active: only once its version has reached
        its survivor's (it has consumed every epoch the survivor has; it may be one ahead, the
        survivor's commit of that epoch still under way).

        >>> layout = chained({"t": 1}, ["w0", "w1", "w2"]).fail("w1").register("t", 0, "w2")
        >>> layout.advance("t", 0, "B", 4, 2).fold_in("t", 0).replica("t", 0, "B").status.value
        'ACTIVE'
        """
        a, b = self.pair(task, partition)
        standby = next((r for r in (a, b) if r.status is Status.STDBY), None)
        if standby is None:
            raise PairsError(f"{ReplicaId.partition_name(task, partition)} has no standby to fold in")
        survivor = b if standby is a else a
        if standby.version < survivor.version:
            raise PairsError(f"{standby.name} is at version {standby.version}, its survivor {survivor.name} at "
                             f"{survivor.version}: replay epochs {standby.version + 1}..{survivor.version} first")
        return self._replace({standby: dataclasses.replace(standby, status=Status.ACTIVE)})

    def discard(self, task: str, partition: int) -> Layout:
        """A failure during catch-up: the standby is dead again (one generation on) and its pin on
        garbage collection released; a retry registers another spare."""
        a, b = self.pair(task, partition)
        standby = next((r for r in (a, b) if r.status is Status.STDBY), None)
        if standby is None:
            raise PairsError(f"{ReplicaId.partition_name(task, partition)} has no standby to discard")
        return self._replace({standby: dataclasses.replace(standby, status=Status.DEAD,
                                                           generation=standby.generation + 1)})

    def restore(self, task: str, partition: int, workers: Sequence[str]) -> Layout:
        """The durable path for a partition that lost both replicas: a recovery re-executes it
        from its durable state, as two new replicas (one generation on) placed chained over the
        live ``workers``.

        >>> layout = chained({"t": 3}, ["w0", "w1", "w2"]).fail("w1").fail("w2")
        >>> [(r.name, r.worker, r.status.value, r.generation) for r in layout.restore("t", 1, ["w0"]).pair("t", 1)]
        [('t[1].A', 'w0', 'ACTIVE', 2), ('t[1].B', 'w0', 'ACTIVE', 2)]
        """
        a, b = self.pair(task, partition)
        if Status.ACTIVE in (a.status, b.status):
            raise PairsError(f"{ReplicaId.partition_name(task, partition)} has an active replica: it is taken over, not restored")
        if not workers:
            raise PairsError(f"{ReplicaId.partition_name(task, partition)}: no live worker to restore it on")
        used = list(workers)
        return self._replace({
            a: dataclasses.replace(a, worker=used[partition % len(used)], status=Status.ACTIVE,
                                   generation=max(a.generation, b.generation) + 1),
            b: dataclasses.replace(b, worker=used[(partition + 1) % len(used)], status=Status.ACTIVE,
                                   generation=max(a.generation, b.generation) + 1)})

    def gc_floor(self, task: str, partition: int) -> int:
        """The last epoch of ``task[partition]``'s inputs that every live consumer replica has
        consumed: what garbage collection may release (the dead one no longer counts; a standby
        counts from its registered version).

        >>> layout = chained({"t": 1}, ["w0", "w1"])
        >>> layout = layout.advance("t", 0, "A", 5, 0).advance("t", 0, "B", 3, 0)
        >>> layout.gc_floor("t", 0), layout.fail("w1").gc_floor("t", 0)
        (3, 5)
        """
        live = [r.version for r in self.pair(task, partition) if r.status is not Status.DEAD]
        return min(live, default=0)

    def _dead_and_survivor(self, task: str, partition: int) -> tuple[Replica, Replica]:
        a, b = self.pair(task, partition)
        if a.status is Status.DEAD and b.status is Status.ACTIVE:
            return a, b
        if b.status is Status.DEAD and a.status is Status.ACTIVE:
            return b, a
        if a.status is b.status is Status.DEAD:
            raise PairsError(f"{ReplicaId.partition_name(task, partition)} lost both replicas: no survivor to copy from; restore it on the "
                             f"durable path (falkirk plan --lost-worker ...)")
        raise PairsError(f"{ReplicaId.partition_name(task, partition)} is {a.status.value}/{b.status.value}: a catch-up needs exactly one "
                         f"dead replica and an active survivor")

    def _replace(self, changed: Mapping[Replica, Replica]) -> Layout:
        return Layout(tuple(changed.get(r, r) for r in self.replicas))


def chained(partitions: Mapping[str, int], workers: Sequence[str]) -> Layout:
    """Chained declustering: replica A of partition p on worker ``p mod n``, replica B on the next
    one, for every paired task (so each worker holds one A and one B per task). A task of N
    partitions uses the first ``max(N, 2)`` workers; the workers after them are its spares,
    where a catch-up recreates lost replicas. One worker (a single machine) holds both
    replicas: that pair survives a failed task instance, not a lost machine.

    >>> [(r.name, r.worker) for r in chained({"t": 3}, ["w0", "w1", "w2"]).replicas]
    [('t[0].A', 'w0'), ('t[0].B', 'w1'), ('t[1].A', 'w1'), ('t[1].B', 'w2'), ('t[2].A', 'w2'), ('t[2].B', 'w0')]
    >>> [r.worker for r in chained({"t": 2}, ["w0", "w1", "spare"]).replicas]
    ['w0', 'w1', 'w1', 'w0']
    """
    if not workers or len(set(workers)) != len(workers):
        raise PairsError(f"workers={list(workers)!r:.120}: name each worker once (FALKIRK_WORKERS)")
    out = []
    for task, count in partitions.items():
        if count < 1:
            raise PairsError(f"{task}: {count} partitions; give at least 1")
        used = list(workers[:max(count, 2)])
        n = len(used)
        for p in range(count):
            out += [Replica(task=task, partition=p, replica="A", worker=used[p % n]), Replica(task=task, partition=p, replica="B", worker=used[(p + 1) % n])]
    return Layout(tuple(out))


def with_task(layout: Layout | None, task: str, partitions: int, workers: Sequence[str]) -> Layout:
    """``layout`` with ``task``'s replicas added, chained over ``workers``, if it has none yet
    (a paired task's first epoch).

    >>> layout = with_task(None, "g1", 2, ["w0", "w1"])
    >>> with_task(layout, "g1", 2, ["w9"]) is layout, len(with_task(layout, "g2", 2, ["w0", "w1"]).replicas)
    (True, 8)
    """
    if layout is not None and any(r.task == task for r in layout.replicas):
        return layout
    added = chained({task: partitions}, workers).replicas
    return Layout((*(layout.replicas if layout else ()), *added))


def spares(layout: Layout, workers: Sequence[str]) -> list[str]:
    """The workers that hold no live replica and were never lost: where a catch-up may go.

    >>> spares(chained({"t": 2}, ["w0", "w1", "w2"]).fail("w1"), ["w0", "w1", "w2"])
    ['w2']
    """
    busy = {r.worker for r in layout.replicas if r.status is not Status.DEAD}
    return [w for w in workers if w not in busy and w not in dead_workers(layout)]


def restore_workers(layout: Layout, workers: Sequence[str]) -> list[str]:
    """The workers the durable path restores a partition that lost both replicas on: those of
    ``workers`` that never lost a replica, else (every one was lost: new machines have taken
    their names, or nothing could run) all of them.

    >>> layout = chained({"t": 2}, ["w0", "w1"]).fail("w1")
    >>> restore_workers(layout, ["w0", "w1"]), restore_workers(layout.fail("w0"), ["w0", "w1"])
    (['w0'], ['w0', 'w1'])
    """
    lost = dead_workers(layout)
    return [w for w in workers if w not in lost] or list(workers)


def dead_workers(layout: Layout) -> set[str]:
    """The workers holding dead replicas and no live one: lost, as far as the layout knows.

    >>> sorted(dead_workers(chained({"t": 2}, ["w0", "w1", "w2"]).fail("w1")))
    ['w1']
    """
    return {r.worker for r in layout.replicas if r.status is Status.DEAD} - {
        r.worker for r in layout.replicas if r.status is not Status.DEAD}


def catch_up_order(layout: Layout, levels: Sequence[str]) -> list[tuple[str, int]]:
    """The (task, partition) pairs to catch up, bottom-up: every lower level's before any higher
    one's (a consumer replica replays from its producers' caught-up replicas). ``levels`` are the
    paired tasks, upstream first.

    >>> layout = chained({"g1": 4, "g2": 4}, ["w0", "w1", "w2", "w3"]).fail("w1")
    >>> catch_up_order(layout, ["g1", "g2"])
    [('g1', 0), ('g1', 1), ('g2', 0), ('g2', 1)]
    """
    order = []
    for task in levels:
        order += [(task, p) for t, p in sorted({(r.task, r.partition) for r in layout.replicas})
                  if t == task and any(r.status is not Status.ACTIVE for r in layout.pair(t, p))]
    return order


def lost_partition_refusal(dag_id: str, reader: str, epoch: int, producer: str, partition: int,
                           producer_epoch: int) -> str:
    """Why ``reader`` does not run its ``epoch`` when both replicas of ``partition`` of ``producer`` are
    lost, and the plan that restores the partition on the durable path (its replicas are task
    instances ``2p`` and ``2p + 1``).

    >>> print(lost_partition_refusal("falkirk_pairs", "stats[0]", 2, "sessions", 2, 2))
    stats[0] epoch 2: both replicas of sessions partition 2 (sessions[2].A, sessions[2].B) are lost, so no replica holds its epoch 2; not running without that partition. Restore it from its durable state and re-execute it alone: falkirk plan --dag falkirk_pairs --failed-task sessions[4]:2 --failed-task sessions[5]:2
    """
    a, b = ReplicaId.pair(task=producer, partition=partition)
    return (f"{reader} epoch {epoch}: both replicas of {ReplicaId.partition_name(producer, partition)} ({a}, {b}) are lost, so no replica "
            f"holds its epoch {producer_epoch}; not running without that partition. Restore it from its durable state "
            f"and re-execute it alone: falkirk plan --dag {dag_id} --failed-task {a.processor}:{producer_epoch} "
            f"--failed-task {b.processor}:{producer_epoch}")


def _other(replica: str) -> str:
    return ReplicaId.NAMES[1 - ReplicaId.NAMES.index(replica)]


@dataclass(frozen=True)
class LayoutEvent:
    """One change of one replica, as the view's history shows it."""

    replica: str  # task[p].R
    what: str
    worker: str
    generation: int
    at: str  # when it was recorded (ISO 8601)


def layout_events(records: Sequence[Mapping[str, Any]]) -> list[LayoutEvent]:
    """What happened to each replica, from the layout's records (``PairLayouts.history``: one
    per change, oldest first): take-overs, standbys registered by a catch-up, fold-ins,
    standbys discarded, partitions restored on the durable path. A replica's first placement
    is not an event.

    >>> rows = [dict(task_id="t", partition=1, replica="A", worker=w, status=s, generation=g, recorded_at=str(g))
    ...         for w, s, g in [("w1", "ACTIVE", 0), ("w1", "DEAD", 1), ("w4", "STDBY", 2), ("w4", "DEAD", 3),
    ...                         ("w5", "STDBY", 4), ("w5", "ACTIVE", 4)]]
    >>> [(e.what, e.worker, e.generation) for e in layout_events(rows)]  # doctest: +NORMALIZE_WHITESPACE
    [('taken over', 'w1', 1), ('standby registered', 'w4', 2), ('standby discarded', 'w4', 3),
     ('standby registered', 'w5', 4), ('folded in', 'w5', 4)]
    """
    meaning = {("ACTIVE", "DEAD"): "taken over", ("STDBY", "DEAD"): "standby discarded",
               ("DEAD", "STDBY"): "standby registered", ("STDBY", "ACTIVE"): "folded in",
               ("DEAD", "ACTIVE"): "restored on the durable path"}
    last: dict[tuple, str] = {}
    events = []
    for row in records:
        key = (row["task_id"], row["partition"], row["replica"])
        before, status = last.get(key), str(row["status"])
        last[key] = status
        what = meaning.get((before, status)) if before is not None else None
        if what:
            events.append(LayoutEvent(str(ReplicaId(task=key[0], partition=key[1], replica=key[2])), what, str(row["worker"]),
                                      int(row["generation"]), str(row["recorded_at"])))
    return events


__all__ = ["Layout", "LayoutEvent", "PairsError", "Replica", "Status", "catch_up_order", "chained",
           "layout_events", "lost_partition_refusal", "spares", "with_task"]
