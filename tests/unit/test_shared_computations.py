"""Concurrent identical previews share computations, and no answer is older than its request."""

from __future__ import annotations

import itertools
import random
import threading
import time

import pytest

from falkirk.plugins.shared_computations import SharedComputations

_ticks = itertools.count()
_tick_lock = threading.Lock()


def tick() -> int:
    """A logical clock: every arrival and every computation's start takes the next number."""
    with _tick_lock:
        return next(_ticks)


@pytest.mark.parametrize("seed", range(20))
def test_every_answer_comes_from_a_computation_that_started_after_the_request(seed: int) -> None:
    rng = random.Random(seed)
    shared = SharedComputations()
    starts: list[int] = []

    def compute() -> int:
        started = tick()
        starts.append(started)
        time.sleep(rng.uniform(0.005, 0.03))
        return started

    answers: list[tuple[int, int]] = []
    delays = [rng.uniform(0, 0.15) for _ in range(40)]

    def request(delay: float) -> None:
        time.sleep(delay)
        arrived = tick()
        answers.append((arrived, shared("preview", compute)))

    threads = [threading.Thread(target=request, args=(d,)) for d in delays]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 40
    assert all(started > arrived for arrived, started in answers)
    # shared: one computation per run of overlapping requests, never one per request
    assert len(starts) < 40 and sorted(starts) == starts


def test_a_burst_costs_at_most_two_computations_and_keys_do_not_share() -> None:
    shared = SharedComputations()
    runs: list[str] = []
    gate = threading.Event()

    def compute(key: str) -> str:
        runs.append(key)
        gate.wait(5)
        return key

    out: list[str] = []
    threads = [threading.Thread(target=lambda k=k: out.append(shared(k, lambda: compute(k))))
               for k in ["a"] * 50 + ["b"] * 5]
    for t in threads:
        t.start()
    time.sleep(0.3)  # every request has arrived while a's and b's first runs wait on the gate
    gate.set()
    for t in threads:
        t.join()
    assert sorted(out) == ["a"] * 50 + ["b"] * 5
    assert runs.count("a") == 2 and runs.count("b") == 2


def test_every_request_of_a_run_that_failed_gets_its_error_and_the_next_run_starts_afresh() -> None:
    shared = SharedComputations()
    gate = threading.Event()
    calls: list[int] = []

    def failing() -> None:
        calls.append(1)
        gate.wait(5)
        raise ValueError("the store is unreachable")

    errors: list[str] = []

    def request() -> None:
        try:
            shared("k", failing)
        except ValueError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=request) for _ in range(10)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join()
    assert errors == ["the store is unreachable"] * 10 and len(calls) == 2
    assert shared("k", lambda: "back") == "back"
