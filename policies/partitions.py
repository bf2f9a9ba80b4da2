"""Partitioned tasks: each partition of a task is a processor of its own.

A task mapped over a fixed number of partitions (Airflow's ``.partial().expand()``, one task
instance per map index ``0..n-1``) keeps, per partition, its own state, outputs, ledger rows
and frontier. The planner names partition ``i`` of task ``t`` the processor ``t[i]``; an
unpartitioned task is the processor ``t`` (map index -1); see
:class:`~falkirk.policies.ids.ProcessorId`.

How a consumer's partitions read a producer's is its **routing**:

* :class:`OneToOne`: partition ``i`` reads producer partition ``i`` (same partition counts);
* :class:`Broadcast`: every partition reads every producer partition whole (an
  unpartitioned producer feeding a partitioned task, or a partitioned one gathered into
  an unpartitioned task, is a broadcast);
* :class:`Repartition`: every partition reads, from every producer partition in partition
  order, the rows whose ``key`` hashes to it.

The runtime records, per consumer partition, the producer partitions and epochs it read
(M̄ per input partition), so the planner's dependencies are exactly the reads.

>>> processors("tally", 3)
('tally[0]', 'tally[1]', 'tally[2]')
>>> Repartition("user").sources(1, producer_partitions=3)
(0, 1, 2)
>>> OneToOne().sources(1, producer_partitions=4)
(1,)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from falkirk.policies.ids import UNPARTITIONED, ProcessorId


class PartitionError(ValueError):
    """A partitioning that cannot work; the message names the task or edge and the fix."""


def processors(task_id: str, partitions: int | None, replicas: int = 1) -> tuple[ProcessorId, ...]:
    """The processors of ``task_id`` with ``partitions`` partitions (``None``: unpartitioned),
    each run by ``replicas`` replicas (process pairs: 2, see :class:`~falkirk.policies.ids.ReplicaId`).

    >>> processors("tally", 3), processors("report", None), processors("stats", 2, replicas=2)
    (('tally[0]', 'tally[1]', 'tally[2]'), ('report',), ('stats[0]', 'stats[1]', 'stats[2]', 'stats[3]'))
    """
    if partitions is None:
        return (ProcessorId(task=task_id),)
    check_count(task_id, partitions)
    return tuple(ProcessorId(task=task_id, map_index=i) for i in range(partitions * replicas))


def check_count(task_id: str, partitions: object) -> int:
    """``partitions`` if it is a usable partition count, else a :class:`PartitionError` naming the fix.

    >>> check_count("tally", 0)
    Traceback (most recent call last):
    ...
    falkirk.policies.partitions.PartitionError: task 'tally': partitions=0: give a whole number from 1 to 1024
    """
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
        raise PartitionError(f"task {task_id!r}: partitions={partitions!r}: give a whole number from 1 to "
                             f"{MAX_PARTITIONS}")
    return partitions


MAX_PARTITIONS = 1024


def expand_to_processors(by_task: Mapping[str, object], partitions: Mapping[str, int | None],
                         replicas: Mapping[str, int] | None = None) -> dict[str, object]:
    """A per-task mapping (regimes, say) keyed by processor instead.

    >>> expand_to_processors({"tally": "eager", "report": "batch"}, {"tally": 2})
    {'tally[0]': 'eager', 'tally[1]': 'eager', 'report': 'batch'}
    """
    return {p: value for task, value in by_task.items()
            for p in processors(task, partitions.get(task), (replicas or {}).get(task, 1))}


@dataclass(frozen=True)
class Routing:
    """How a consumer partition reads a producer's partitions (see the module docstring)."""

    def sources(self, partition: int, producer_partitions: int) -> tuple[int, ...]:
        """The producer partitions consumer partition ``partition`` reads, in the order it reads them."""
        return tuple(range(producer_partitions))

    def spec(self) -> str:
        return type(self).__name__.lower()


@dataclass(frozen=True)
class OneToOne(Routing):
    """Partition ``i`` reads producer partition ``i``: both tasks have the same partition count."""

    def sources(self, partition: int, producer_partitions: int) -> tuple[int, ...]:
        if partition >= producer_partitions:
            raise PartitionError(f"one-to-one: partition {partition} has no producer partition (the producer has "
                                 f"{producer_partitions}); give both tasks the same partition count, or read it "
                                 f"with Broadcast() or Repartition(key)")
        return (partition,)

    def spec(self) -> str:
        return "one_to_one"


@dataclass(frozen=True)
class Broadcast(Routing):
    """Every partition reads every producer partition whole."""


@dataclass(frozen=True)
class Repartition(Routing):
    """Every partition reads its slice (the rows whose ``key`` hashes to it) of every producer partition."""

    key: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise PartitionError("Repartition(key): name the column whose value chooses the partition, "
                                 "e.g. Repartition(key=\"user\")")

    def spec(self) -> str:
        return f"repartition(key={self.key})"


def parse_routing(text: str) -> Routing:
    """The routing written by :meth:`Routing.spec`.

    >>> parse_routing("repartition(key=user)"), parse_routing("one_to_one")
    (Repartition(key='user'), OneToOne())
    """
    text = text.strip()
    if text == "one_to_one":
        return OneToOne()
    if text == "broadcast":
        return Broadcast()
    m = re.fullmatch(r"repartition\(key=([^()]+)\)", text)
    if m:
        return Repartition(m[1])
    raise PartitionError(f"routing {text!r}: give one_to_one, broadcast or repartition(key=COLUMN)")


def processor_edges(producer: str, consumer: str, routing: Routing, partitions: Mapping[str, int | None],
                    ) -> list[tuple[ProcessorId, ProcessorId]]:
    """The processor-level edges of one task-level edge: (producer processor, consumer processor).

    An unpartitioned end counts as one partition; only :class:`OneToOne` needs equal counts.

    >>> processor_edges("events", "tally", Repartition("user"), {"events": 2, "tally": 2})
    [('events[0]', 'tally[0]'), ('events[1]', 'tally[0]'), ('events[0]', 'tally[1]'), ('events[1]', 'tally[1]')]
    >>> processor_edges("tally", "report", Broadcast(), {"tally": 2})
    [('tally[0]', 'report'), ('tally[1]', 'report')]
    """
    src, dst = partitions.get(producer), partitions.get(consumer)
    if isinstance(routing, OneToOne) and src != dst:
        raise PartitionError(f"edge {producer} -> {consumer}: one-to-one needs equal partition counts, and "
                             f"{producer} has {src or 'no'} partitions, {consumer} {dst or 'none'}; read it with "
                             f"Broadcast() or Repartition(key)")
    out = []
    for c in range(dst or 1):
        for p in routing.sources(c, src or 1):
            out.append((ProcessorId(task=producer, map_index=p if src else UNPARTITIONED),
                        ProcessorId(task=consumer, map_index=c if dst else UNPARTITIONED)))
    return out


def partition_counts(processor_ids: Iterable[str]) -> dict[str, int]:
    """Per partitioned task among ``processor_ids``, its partition count (its greatest index + 1).

    >>> partition_counts(["a[0]", "a[2]", "b"])
    {'a': 3}
    """
    counts: dict[str, int] = {}
    for p in map(ProcessorId.parse, processor_ids):
        if p.partitioned:
            counts[p.task] = max(counts.get(p.task, 0), p.map_index + 1)
    return counts
