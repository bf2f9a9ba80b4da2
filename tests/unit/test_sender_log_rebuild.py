"""Rebuilding a state from retained blocks (Smith & Watson, CS-TR-836 §IV.C), as pure decisions on
each scenario's numbers: what is replayed, in which order, and the named refusal when a block
is gone."""

from __future__ import annotations

import pytest

from falkirk.policies.sender_logs.acks import Acknowledgements, retained
from falkirk.policies.sender_logs.rebuild import BlocksLost, rebuild


def test_s1_a_stateless_task_replays_the_block_whose_ack_was_in_flight_and_the_failed_one() -> None:
    acks = Acknowledgements.none().record(("ingest", "clean"), "enrich", 4)  # the ack of 5 is in flight
    point = acks.prune_point(("ingest", "clean"), ("enrich",))
    plan = rebuild("clean", 6, pruned={"ingest": point}, retained={"ingest": retained(range(1, 7), point)})
    assert plan.replay == (("ingest", (5, 6)),)


def test_s2_an_at_end_aggregator_replays_every_epoch_and_the_negative_control_is_refused() -> None:
    assert rebuild("total", 8, pruned={"ingest": 0}, retained={"ingest": range(1, 9)}).replay == \
        (("ingest", tuple(range(1, 9))),)
    # Declared immediate, the aggregator acknowledged 1-7 and ingest pruned them: what a rebuild
    # from the prune point replays is only epoch 8, a state missing seven epochs. The rebuild
    # cannot tell (the blocks it needs by the declaration are there); the integration test
    # detects the wrong total against the failure-free run.
    assert rebuild("total", 8, pruned={"ingest": 7}, retained={"ingest": [8]}).replay == (("ingest", (8,)),)


def test_s3b_a_join_replays_the_whole_build_side_and_the_unacknowledged_probe_blocks() -> None:
    plan = rebuild("join", 7, pruned={"dim_scan": 0, "fact_scan": 5},
                   retained={"dim_scan": range(1, 8), "fact_scan": [6, 7]})
    assert plan.replay == (("dim_scan", tuple(range(1, 8))), ("fact_scan", (6, 7))) and plan.blocks == 9


@pytest.mark.parametrize("retained_v2, message", [
    ([6, 7], "v3 epoch 7: unrecoverable: required blocks 1-5 of origin v2 missing"),
    ([1, 2, 4, 6, 7], "v3 epoch 7: unrecoverable: required blocks 3, 5 of origin v2 missing"),
])
def test_s5_case_2_volatile_blocks_lost_with_their_producer_are_named(retained_v2, message) -> None:
    with pytest.raises(BlocksLost, match=f"^{message}"):
        rebuild("v3", 7, pruned={"v1": 5, "v2": 0}, retained={"v1": [6, 7], "v2": retained_v2})
    # Durable logs keep the old incarnation's blocks: the same rebuild goes through.
    assert rebuild("v3", 7, pruned={"v2": 0}, retained={"v2": range(1, 8)}).blocks == 7
