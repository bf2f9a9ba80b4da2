"""The replay of a recovery plan as a reconciler: observe, decide, act, repeat.

Each pass, the executor (``falkirk.plugins.replay``) reads Airflow and the store once each into
an :class:`~.views.AirflowView` and a :class:`~.views.StoreView`; :func:`~.decide.decide` turns
them, with the replay's :class:`~.views.Memory`, into a :class:`~.actions.Decision` (actions as
values, the next memory, a status); the applier carries the actions out. Nothing here reads or
writes anything: a killed replay is a loop started again from ``Memory.fresh``, and what it reads
tells it what the killed one did.
"""

from falkirk.policies.replay.actions import (
    Action,
    Clear,
    Decision,
    Done,
    Invalidate,
    MarkSuccess,
    QueueRun,
    RestorePairs,
    Say,
    SetRunState,
    SettleSecondRuns,
    Status,
    Stopped,
    Working,
)
from falkirk.policies.replay.decide import STAGES, decide
from falkirk.policies.replay.views import AirflowView, Memory, StoreView

__all__ = ["Action", "AirflowView", "Clear", "Decision", "Done", "Invalidate", "MarkSuccess", "Memory", "QueueRun",
           "RestorePairs", "STAGES", "Say", "SetRunState", "SettleSecondRuns", "Status", "StoreView", "Stopped", "Working",
           "decide"]
