"""What recovery reads about a DAG from Airflow's REST API: its tasks' regimes and epoch clock
(from the Falkirk API, which reads them from the serialized DAG), and its runs by epoch."""

from __future__ import annotations

from collections.abc import Sequence

from falkirk.plugins.airflow_rest import FALKIRK_API, AirflowClient, AirflowError, api_path
from falkirk.policies.epochs import EpochClock, runs_by_epoch
from falkirk.policies.ids import ProcessorId
from falkirk.policies.partitions import processors
from falkirk.policies.planning.recovery import PlanError
from falkirk.policies.regimes import Regime


def regimes_and_clock(dag_id: str, client: AirflowClient) -> tuple[dict[ProcessorId, Regime], EpochClock | None]:
    """The regimes of the DAG's tasks, by processor (every partition of a partitioned task is one,
    see :mod:`falkirk.policies.partitions`), and its epoch clock (``None`` unless its tasks share one)."""
    try:
        body = client.request("GET", api_path("dags", dag_id, "regimes", root=FALKIRK_API))
    except AirflowError as exc:  # planning without the regimes would leave out tasks with no ledger row
        raise PlanError(f"the Falkirk API of Airflow at {client.base_url} did not give the regimes of {dag_id!r} "
                        f"({exc}); is falkirk-airflow installed where Airflow's API server runs?") from None
    regimes = {p: Regime.parse(t["regime"]) for t in body["tasks"] if t.get("regime")
               for p in processors(t["task_id"], t.get("partitions"), Regime.parse(t["regime"]).replicas)}
    clocks = {t["epoch_clock"] for t in body["tasks"] if t.get("epoch_clock")}
    return regimes, EpochClock.parse(clocks.pop()) if len(clocks) == 1 else None


def latest_run_epoch(dag_id: str, client: AirflowClient, clock: EpochClock) -> int | None:
    """The epoch of the DAG's latest run on its grid (``airflow dags test`` runs left out): the
    last epoch a plan covers, which may be past the ledger's newest epoch (runs that committed
    nothing yet) or before it (rows of runs deleted since: see
    :func:`falkirk.plugins.discard.beyond_note`); ``None`` when the DAG has no run on its grid.
    A run Airflow started on asset events has no logical date: the date of the partition it runs
    counts (:func:`falkirk.policies.epochs.runs_by_epoch`, the API server's rule too)."""
    return max(runs_by_epoch(client.run_dates(dag_id), clock), default=None)


def runs_at_dates(dag_id: str, client: AirflowClient, clock: EpochClock, epochs: Sequence[int]) -> dict[int, str]:
    """The one run of each of ``epochs`` that Airflow has at its date (none where it has two)."""
    found = {epoch: client.dag_runs_at(dag_id, clock.logical_date(epoch)) for epoch in epochs}
    return {epoch: runs[0] for epoch, runs in found.items() if len(runs) == 1}
