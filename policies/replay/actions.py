"""What a replay's pass decides to do, as values: the applier carries them out, in order.

Each action names everything its execution needs, so the applier decides nothing; ``line`` is the
progress line it prints once the action is done. A :class:`Decision` holds the actions, the
memory of the next pass, the status, and the lines that report what the pass saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from falkirk.policies.replay.views import Memory


@dataclass(frozen=True, kw_only=True)
class Invalidate:
    """Roll back ``rows`` (ledger rows of later DAG runs computed from rolled-back epochs) under the
    rollback name ``name`` (one append per name: applied twice, it rolls back nothing twice)."""

    rows: tuple[Any, ...]
    name: str
    line: str


@dataclass(frozen=True, kw_only=True)
class Clear:
    """Clear ``tasks`` of the DAG run ``run_id`` (of epoch ``epoch``), without expanding up or downstream."""

    epoch: int
    run_id: str
    tasks: tuple[str, ...]
    line: str


@dataclass(frozen=True, kw_only=True)
class MarkSuccess:
    """Mark success the instance of ``row`` (a commit whose epoch completed) in ``run_id``, after
    emitting the asset events its failed attempt did not (emitted first: a replay started again
    between the two still emits them)."""

    row: Any
    run_id: str
    note: str


@dataclass(frozen=True, kw_only=True)
class QueueRun:
    """Set the DAG run ``run_id`` back to queued, with ``note``."""

    run_id: str
    note: str


@dataclass(frozen=True, kw_only=True)
class SetRunState:
    """Set the DAG run ``run_id`` to ``state``, with ``note``."""

    run_id: str
    state: str
    note: str


@dataclass(frozen=True, kw_only=True)
class RestorePairs:
    """Give ``partitions`` (task, partition) of paired tasks that lost both replicas two new
    replicas on live workers, on the durable path."""

    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Say:
    """Print ``line``: what the actions before it did, said once they are done."""

    line: str


@dataclass(frozen=True, kw_only=True)
class SettleSecondRuns:
    """Mark success a consumer DAG's refused second runs of the epochs the plan redid."""


Action = Invalidate | Clear | MarkSuccess | QueueRun | SetRunState | RestorePairs | SettleSecondRuns | Say


@dataclass(frozen=True)
class Working:
    """Not done: ``done`` of ``total`` waited-for instances succeeded. ``again``: the next pass
    follows at once (this one moved to another stage), else after the poll interval."""

    done: int = 0
    total: int = 0
    again: bool = False


@dataclass(frozen=True)
class Done:
    """Every re-run succeeded and every run the replay touched is settled."""

    reran: int


@dataclass(frozen=True)
class Stopped:
    """The replay cannot go on by itself: ``reason`` says what it waits for and what to do; it is
    resumed, once that is done, with ``falkirk replay PLAN_ID``. ``stalled``: it waited on
    something it cannot change for the stall time (else an instance failed)."""

    reason: str
    stalled: bool = False


Status = Working | Done | Stopped


@dataclass(frozen=True)
class Decision:
    """What one pass decided: the ``actions`` to carry out, in order, the ``memory`` of the next
    pass, the ``status``, and progress ``lines`` about what it saw (said before the actions)."""

    actions: Sequence[Action]
    memory: Memory
    status: Status
    lines: Sequence[str] = ()
