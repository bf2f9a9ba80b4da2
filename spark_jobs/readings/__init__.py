"""Meter readings in, running totals out to an external system: an input is acknowledged once
its epoch is checkpointed, an output once the external system accepts it.

``intake`` (Ephemeral) reads each epoch's batch from an :class:`~falkirk.spark_jobs.inbox.Inbox`
and drops invalid readings; ``tally`` (lazy checkpoint, durable every epoch) keeps the
running kWh per meter; ``deliver`` (Ephemeral) sends the totals to an
:class:`~falkirk.spark_jobs.outbox.Outbox`, whose reader accepts them by receipt.

Whether ``tally`` logs its output decides when the source may forget its input (Falkirk Wheel §4.2-4.3):
when it discards (``log_outputs=False``), the inbox keeps an epoch until the outbox has
accepted it; when it logs, the inbox may forget an epoch as soon as tally's checkpoint of it
is durable.

The inbox and the outbox live at ``$FALKIRK_READINGS_INBOX`` and ``$FALKIRK_READINGS_OUTBOX``
(``{dag_id}`` in them is replaced), by default ``inbox/`` and ``outbox/`` under
``{durable}/{dag_id}/`` when the durable tier is a local path.
"""

from __future__ import annotations

import os

from falkirk.policies import Ephemeral, LazyCheckpoint
from falkirk.policies.planning.chains import TaskGraph
from falkirk.policies.regimes import Regime

EDGES = [("intake", "tally"), ("tally", "deliver")]
GRAPH = TaskGraph.of(("intake", "tally", "deliver"), EDGES)
INBOX_ENV, OUTBOX_ENV = "FALKIRK_READINGS_INBOX", "FALKIRK_READINGS_OUTBOX"


def regimes(tally_logs: bool) -> dict[str, Regime]:
    """The regimes of the three tasks; ``tally_logs`` is G1b (True) or G1a (False)."""
    return {"intake": Ephemeral(), "tally": LazyCheckpoint(every=1, log_outputs=tally_logs), "deliver": Ephemeral()}


def location(env_var: str, durable_uri: str, dag_id: str, name: str) -> str:
    """``$env_var`` with ``{dag_id}`` replaced, or ``{durable}/{dag_id}/{name}`` for a local durable tier."""
    path = os.environ.get(env_var, "").replace("{dag_id}", dag_id)
    if path:
        return path
    if "://" in durable_uri:
        raise ValueError(f"{env_var} is not set and the durable tier {durable_uri!r} is not a local path: "
                         f"set {env_var} to the {name} directory")
    return os.path.join(durable_uri, dag_id, name)


def reading(epoch: int, i: int) -> dict[str, object]:
    """The ``i``-th reading delivered in ``epoch`` (deterministic; some are invalid, kWh <= 0).

    >>> reading(1, 0), reading(1, 1)
    ({'reading_id': 1000, 'meter': 'm1', 'kwh': 1}, {'reading_id': 1001, 'meter': 'm0', 'kwh': -1})
    """
    return {"reading_id": epoch * 1000 + i, "meter": f"m{(i * 3 + epoch) % 4}", "kwh": (i * 5 + epoch * 2) % 7 - 1}
