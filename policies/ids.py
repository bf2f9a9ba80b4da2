"""The identities Airflow gives DAGs and tasks, checked by Airflow's own rule.

Airflow accepts a DAG id or a task id made of letters, digits, ``_``, ``.`` and ``-``, at most
250 characters, with no ``..`` (``airflow.utils.helpers.validate_key``). Every id a command,
the API or the view takes is checked here before anything is read or written, so that an id
such as ``x/../orders`` never reaches a REST path (where it would name another DAG) or a
store path (where it would name another DAG's tables).

>>> check_dag_id("falkirk_orders")
'falkirk_orders'
>>> check_dag_id("x/../falkirk_orders")
Traceback (most recent call last):
...
falkirk.policies.ids.IdError: --dag 'x/../falkirk_orders': not an Airflow DAG id: use letters, digits, _, . and - (at most 250 characters, no '..'), e.g. falkirk_orders

The planner's identities are typed values with a string wire form, each built by keywords
only and parsed in one place: :class:`ProcessorId` (``task`` or ``task[i]``, one partition or
replica of a mapped task), :class:`ReplicaId` (``task[p].R``, a replica of a process pair, which
owns the arithmetic between partitions, replicas and Airflow's map indexes) and
:class:`CommitId` (one commit of one processor's epoch under one incarnation).

>>> p = ProcessorId.parse("tally[2]")
>>> p, p.task, p.map_index, p == "tally[2]"
('tally[2]', 'tally', 2, True)
>>> r = ReplicaId.of(task="stats", map_index=3)
>>> str(r), r.processor, r.twin.processor
('stats[1].B', 'stats[3]', 'stats[2]')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

MAX_LENGTH = 250
_KEY = re.compile(r"[\w.-]+")


class IdError(ValueError):
    """An id Airflow would refuse; the message names the field and the fix."""


def is_airflow_key(value: object) -> bool:
    """Whether ``value`` is an id Airflow accepts for a DAG or a task.

    >>> [is_airflow_key(v) for v in ("orders", "group.task", "a..b", "./d", "", "x" * 251, 7)]
    [True, True, False, False, False, False, False]
    """
    return (isinstance(value, str) and 0 < len(value) <= MAX_LENGTH and _KEY.fullmatch(value) is not None
            and ".." not in value)


def _check(value: object, field: str, what: str, example: str) -> str:
    if not is_airflow_key(value):
        shown = repr(value)[:80] if isinstance(value, str) else f"{type(value).__name__}"
        named = f"{field} {shown}" if field else shown  # no field: argparse names the flag itself
        raise IdError(f"{named}: not an Airflow {what} id: use letters, digits, _, . and - (at most {MAX_LENGTH} "
                      f"characters, no '..'), e.g. {example}")
    return value  # type: ignore[return-value]


def check_dag_id(value: object, field: str = "--dag") -> str:
    """``value`` if it is an id Airflow accepts for a DAG, else :class:`IdError` naming ``field``.

    >>> check_dag_id("orders.daily", field="dag_id")
    'orders.daily'
    """
    return _check(value, field, "DAG", "falkirk_orders")


def check_task_id(value: object, field: str = "--task") -> str:
    """``value`` if it is an id Airflow accepts for a task, else :class:`IdError` naming ``field``.

    >>> check_task_id("leaders")
    'leaders'
    >>> check_task_id("lead ers", field="--failed-task")
    Traceback (most recent call last):
    ...
    falkirk.policies.ids.IdError: --failed-task 'lead ers': not an Airflow task id: use letters, digits, _, . and - (at most 250 characters, no '..'), e.g. aggregate
    """
    return _check(value, field, "task", "aggregate")


UNPARTITIONED = -1
"""The map index of a task Airflow does not map: its one processor is the task itself."""


class ProcessorId(str):
    """One processor of a DAG: a task (``task``) or one map index of a mapped task (``task[i]``).

    It *is* its wire form (a ``str``: a dict keyed by processor ids, a plan's JSON and a
    scenario file read the same), and carries the task and map index it was built from, so
    nothing parses it again. Airflow's task ids cannot hold ``[``, so the two forms never collide.

    >>> ProcessorId(task="events", map_index=0), ProcessorId(task="report")
    ('events[0]', 'report')
    >>> ProcessorId(task="events", map_index=0).map_index, ProcessorId(task="report").partitioned
    (0, False)
    >>> ProcessorId("events[0]")
    Traceback (most recent call last):
    ...
    TypeError: ProcessorId.__new__() takes 1 positional argument but 2 were given
    """

    task: str
    map_index: int

    def __new__(cls, *, task: str, map_index: int = UNPARTITIONED) -> ProcessorId:
        index = UNPARTITIONED if map_index is None or map_index < 0 else int(map_index)
        self = super().__new__(cls, task if index == UNPARTITIONED else f"{task}[{index}]")
        self.task, self.map_index = task, index
        return self

    _FORM: ClassVar[re.Pattern[str]] = re.compile(r"(?P<task>[^\[\]]+)\[(?P<index>\d+)\]")

    @classmethod
    def parse(cls, text: str) -> ProcessorId:
        """The processor a wire form names (``task`` or ``task[i]``); the only parser of the form.

        >>> ProcessorId.parse("events[11]").map_index, ProcessorId.parse("report").map_index
        (11, -1)
        """
        if isinstance(text, ProcessorId):
            return text
        m = cls._FORM.fullmatch(text)
        return cls(task=m["task"], map_index=int(m["index"])) if m else cls(task=text)

    @property
    def partitioned(self) -> bool:
        """Whether this is one map index of a mapped task."""
        return self.map_index != UNPARTITIONED

    def __getnewargs_ex__(self) -> tuple[tuple[()], dict[str, Any]]:
        return (), {"task": self.task, "map_index": self.map_index}

    def __repr__(self) -> str:
        return str.__repr__(self)


@dataclass(frozen=True, order=True, kw_only=True)
class ReplicaId:
    """One replica (``A`` or ``B``) of one partition of a process-pair task: ``task[p].R``.

    Airflow maps ``.expand(partition=range(N))`` of a pair task into 2N task instances, the two
    replicas of partition ``p`` at map indexes ``2p`` and ``2p + 1``; this class is the only
    place that arithmetic lives.

    >>> r = ReplicaId(task="stats", partition=1, replica="A")
    >>> str(r), r.map_index, r.twin, ReplicaId.parse("stats[1].B") == r.twin
    ('stats[1].A', 2, ReplicaId(task='stats', partition=1, replica='B'), True)
    >>> ReplicaId(task="stats", partition=1, replica="C")
    Traceback (most recent call last):
    ...
    falkirk.policies.ids.IdError: replica 'C': a pair's replicas are A and B
    """

    NAMES: ClassVar[tuple[str, str]] = ("A", "B")

    task: str
    partition: int
    replica: str

    def __post_init__(self) -> None:
        if self.replica not in self.NAMES:
            raise IdError(f"replica {self.replica!r:.20}: a pair's replicas are {' and '.join(self.NAMES)}")

    @classmethod
    def of(cls, *, task: str, map_index: int) -> ReplicaId:
        """The replica Airflow runs as ``task``'s task instance ``map_index``.

        >>> ReplicaId.of(task="t", map_index=3)
        ReplicaId(task='t', partition=1, replica='B')
        """
        return cls(task=task, partition=map_index // len(cls.NAMES), replica=cls.NAMES[map_index % len(cls.NAMES)])

    @classmethod
    def pair(cls, *, task: str, partition: int) -> tuple[ReplicaId, ReplicaId]:
        """Both replicas of one partition, ``A`` first."""
        return cls(task=task, partition=partition, replica="A"), cls(task=task, partition=partition, replica="B")

    @staticmethod
    def partition_name(task: str, partition: int) -> str:
        """How messages name one partition of a pair task (both its replicas): not ``task[p]``,
        which is a processor (a map index).

        >>> ReplicaId.partition_name("stats", 1)
        'stats partition 1'
        """
        return f"{task} partition {partition}"

    @classmethod
    def parse(cls, text: str) -> ReplicaId:
        """The replica ``task[p].R`` names, else :class:`IdError` naming the form.

        >>> ReplicaId.parse("stats[0].B").map_index
        1
        """
        partition, _, replica = text.strip().rpartition(".")
        named = ProcessorId.parse(partition)
        if not named.partitioned or replica not in cls.NAMES:
            raise IdError(f"replica {text!r:.80}: write it as task[partition].A or task[partition].B, e.g. stats[0].B")
        return cls(task=named.task, partition=named.map_index, replica=replica)

    @property
    def map_index(self) -> int:
        """Airflow's map index of this replica's task instance."""
        return self.partition * len(self.NAMES) + self.NAMES.index(self.replica)

    @property
    def processor(self) -> ProcessorId:
        """The processor (task instance) this replica runs as: ``task[map index]``."""
        return ProcessorId(task=self.task, map_index=self.map_index)

    @property
    def twin(self) -> ReplicaId:
        """The other replica of the same partition."""
        return ReplicaId(task=self.task, partition=self.partition, replica=self.NAMES[1 - self.NAMES.index(self.replica)])

    def __str__(self) -> str:
        return f"{self.task}[{self.partition}].{self.replica}"


@dataclass(frozen=True, order=True, kw_only=True)
class CommitId:
    """One commit of one processor's epoch: the ``incarnation``-th time ``epoch`` was done (a
    recovery that rolls an epoch back redoes it under the next incarnation).

    >>> c = CommitId(dag="orders", processor=ProcessorId(task="tally", map_index=1), epoch=2, incarnation=1)
    >>> str(c), c.task, c.map_index
    ('orders.tally[1]@2#1', 'tally', 1)
    """

    dag: str
    processor: ProcessorId
    epoch: int
    incarnation: int = 0

    @property
    def task(self) -> str:
        return self.processor.task

    @property
    def map_index(self) -> int:
        return self.processor.map_index

    def __str__(self) -> str:
        return f"{self.dag}.{self.processor}@{self.epoch}#{self.incarnation}"


class OfProcessor:
    """What a record naming one processor by its ``task_id`` and ``map_index`` columns derives."""

    task_id: str
    map_index: int

    @property
    def processor(self) -> ProcessorId:
        """The processor as the planner names it: ``task`` or, for one partition, ``task[i]``."""
        return ProcessorId(task=self.task_id, map_index=self.map_index)


class OfCommit(OfProcessor):
    """What a record naming one commit by its ``dag_id``, ``task_id``, ``map_index``, ``epoch`` and
    ``incarnation`` columns derives: the commit's identity."""

    dag_id: str
    epoch: int
    incarnation: int

    @property
    def commit_id(self) -> CommitId:
        return CommitId(dag=self.dag_id, processor=self.processor, epoch=self.epoch, incarnation=self.incarnation)


__all__ = ["CommitId", "IdError", "MAX_LENGTH", "OfCommit", "OfProcessor", "ProcessorId", "ReplicaId", "UNPARTITIONED",
           "check_dag_id", "check_task_id", "is_airflow_key"]
