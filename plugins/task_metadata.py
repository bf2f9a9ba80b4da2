"""What the scheduler and the API server read of a Falkirk task without running it: its regime,
epoch clock, partition count and concurrent inputs, from the live operator, a mapped (partitioned) task's
arguments, or the serialized DAG (the API server never imports DAG files or the operator).

>>> from types import SimpleNamespace
>>> task = SimpleNamespace(falkirk_regime="eager_checkpoint", falkirk_epoch_clock=None, partial_kwargs=None)
>>> regime_of(task), partitions_of(SimpleNamespace(partial_kwargs={"partitions": 4}))
(EagerCheckpoint(), 4)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from falkirk.policies.epochs import EpochClock
from falkirk.policies.regimes import Regime


def regime_of(task: Any) -> Regime | None:
    """The regime of a task, live or deserialized from the DAG table; ``None`` if it has none.

    A partitioned (mapped) task is not constructed where the DAG is parsed: its regime is
    among its arguments, in the text form when deserialized.
    """
    spec = getattr(task, "falkirk_regime", None) or _mapped_argument(task, "regime")
    return Regime.parse(str(spec)) if spec else None


def epoch_clock_of(task: Any) -> EpochClock | None:
    """The epoch clock of a task, live or deserialized from the DAG table; ``None`` if it has none."""
    spec = getattr(task, "falkirk_epoch_clock", None) or _mapped_argument(task, "epoch_clock")
    if not spec and _mapped_argument(task, "regime"):  # a mapped task takes the DAG's clock when it runs
        dag = getattr(task, "dag", None)
        timetable = getattr(dag, "timetable", None)
        spec = (getattr(dag, "default_args", None) or {}).get("epoch_clock") or getattr(timetable, "clock", None)
    return EpochClock.parse(str(spec)) if spec else None


def partitions_of(task: Any) -> int | None:
    """The partition count of a partitioned task (live, mapped or deserialized); ``None`` if it has none."""
    count = getattr(task, "partitions", None)
    if count is None:
        count = _mapped_argument(task, "partitions")
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def concurrent_inputs_of(task: Any) -> tuple[str, ...]:
    """The tasks ``task`` reads while they run (its ``concurrent_inputs``; live, mapped or
    deserialized, where the operator keeps them as ``falkirk_concurrent_inputs``, comma-separated).

    >>> from types import SimpleNamespace
    >>> concurrent_inputs_of(SimpleNamespace(falkirk_concurrent_inputs="draw")), concurrent_inputs_of(object())
    (('draw',), ())
    """
    found = getattr(task, "falkirk_concurrent_inputs", None)
    if found is None:
        found = _mapped_argument(task, "concurrent_inputs") or ()
    return tuple(t for t in found.split(",") if t) if isinstance(found, str) else tuple(found)


def partition_outlets_of(task: Any) -> bool:
    """Whether ``task``'s asset events carry its epoch's partition key (its ``partition_outlets``;
    live, mapped or deserialized).

    >>> from types import SimpleNamespace
    >>> partition_outlets_of(SimpleNamespace(partition_outlets=True)), partition_outlets_of(object())
    (True, False)
    """
    found = getattr(task, "partition_outlets", None)
    if found is None:
        found = _mapped_argument(task, "partition_outlets")
    return found is True


def _mapped_argument(task: Any, name: str) -> Any:
    """An argument of a mapped task (``partial_kwargs``); ``None`` for any other task."""
    kwargs = getattr(task, "partial_kwargs", None)
    return kwargs.get(name) if isinstance(kwargs, Mapping) else None
