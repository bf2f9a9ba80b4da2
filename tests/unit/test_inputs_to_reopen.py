"""How far back a source must hold its input again for a bad epoch's recovery.

The reference application's shape, its ledger as it runs (rank's state durable every third
epoch, everything of ``events`` on a worker's disk), and the planner as the oracle: whatever a
recovery of a bad epoch re-runs of ``events``, with or without every scratch copy lost, the
source still holds. The sixty-minute soak of seed 972360363 met the case where it did not: the
window before the bad epoch (epochs 4-6 for epoch 6) was held again, a worker was lost during
the recovery, rank fell back to its durable state of epoch 3, and popularity's re-run of epoch 4
read epochs 2 and 3, which the source had forgotten.
"""

from __future__ import annotations

import pytest

from falkirk.policies.planning.monitor import acknowledged_inputs, inputs_to_reopen
from falkirk.policies.planning.recovery import BadEpoch, plan_recovery
from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef
from falkirk.spark_jobs.figure1 import EDGES, GRAPH, REGIMES
from falkirk.spark_jobs.figure1.popularity import WINDOW

DAG = "falkirk_figure1"
LAST = 9


def _row(task: str, epoch: int) -> LedgerEntry:
    regime = REGIMES[task]
    durable_state = task == "stats" or (task == "rank" and epoch % 3 == 0)
    durable_output = task in ("popularity", "stats")
    state = None
    if regime.keeps_state:
        state = f"/durable/{task}/state" if durable_state else f"/scratch/worker-a/{task}/state"
    out = f"/durable/{task}/output" if durable_output else f"/scratch/worker-a/{task}/output"
    inputs = tuple(InputRef(task_id=up, output="output", through=epoch, reads_back=min(WINDOW - 1, epoch - 1) if task == "popularity" else 0)
                   for up, down in EDGES if down == task)
    return LedgerEntry(dag_id=DAG, task_id=task, epoch=epoch, regime=regime.spec(), run_id=f"epoch-{epoch}", try_number=1, state_uri=state,
                       state_tier=None if state is None else state.split("/")[1],
                       outputs=(OutputRef("output", out, out.split("/")[1], epoch, 10),), inputs=inputs,
                       worker="worker-a")


ROWS = [_row(t, e) for e in range(1, LAST + 1) for t in REGIMES]


def durable(uri: str, key: object) -> bool:
    return uri.startswith("/durable/")


def everything(uri: str, key: object) -> bool:
    return True


def _first_source_epoch_read(bad_epoch: int, readable) -> int:
    """The oldest epoch of the clickstream the planner's recovery of ``bad_epoch`` reads."""
    plan = plan_recovery(DAG, GRAPH, ROWS, [BadEpoch("events", bad_epoch)], LAST, readable)
    return min(plan.task("events").rerun)


def test_the_acknowledgement_assumes_right_inputs() -> None:
    # Every scratch copy lost, inputs right: rank rolls back to 9, popularity reads 8-9 again.
    assert acknowledged_inputs(ROWS, durable, GRAPH) == {"events": 7}


def test_a_bad_epoch_reopens_the_source_below_the_window_when_scratch_may_be_lost() -> None:
    assert inputs_to_reopen(ROWS, durable, 6, GRAPH) == {"events": 2}
    assert _first_source_epoch_read(6, durable) == 2  # the soak's case: below the window's 4
    assert 6 - WINDOW + 1 == 4


@pytest.mark.parametrize("bad_epoch", range(1, LAST + 1))
@pytest.mark.parametrize("readable", [durable, everything], ids=["scratch lost", "scratch kept"])
def test_every_bad_epoch_recovery_reads_only_what_the_source_holds_again(bad_epoch: int, readable) -> None:
    reopen = inputs_to_reopen(ROWS, durable, bad_epoch, GRAPH)["events"]
    assert 1 <= reopen <= bad_epoch
    assert _first_source_epoch_read(bad_epoch, readable) >= reopen
    # and it is tight: with every scratch copy lost, the recovery reads from there on
    if readable is durable:
        assert _first_source_epoch_read(bad_epoch, readable) == reopen
