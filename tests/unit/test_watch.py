"""The watch's loop: when it responds to a lost worker, again after a response that failed, and
again when a worker that came back is lost once more. ``respond`` (the take-over, plan and
replay, which the cluster tests run for real) is replaced by a recorder that fails as told: the
failures are the test's data."""

from __future__ import annotations

import pytest

from falkirk.plugins import watch as watching


def test_a_failed_response_is_tried_again_and_a_worker_lost_again_is_responded_to_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    calls: list[tuple[float, str, str]] = []

    def respond(dag, worker, store, client, progress, replay=True):  # noqa: ANN001, ANN202
        calls.append((now[0], dag, worker))
        if dag == "busy" and sum(c[1] == "busy" for c in calls) == 1:
            raise RuntimeError("DAG 'busy' is being recovered by plan p0")
        assert replay is False  # the watch replays beside its loop, never inside it
        return None

    monkeypatch.setattr(watching, "respond", respond)
    monkeypatch.setattr(watching.time, "sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))
    # w0 always answers; w1 until 10 s, then is silent, a new w1 answers from 50 s to 60 s, then silence
    said: list[str] = []
    watching.watch(["calm", "busy"], None, None, ["w0", "w1"], timeout=15, poll=5,
                   ping=lambda: ["w0", *(["w1"] if now[0] < 10 or 50 <= now[0] < 60 else [])],
                   progress=said.append, stop=lambda: now[0] >= 150, clock=lambda: now[0])
    # lost at the first poll more than 15 s after its last answer (5 s, then 55 s); the failed
    # response is made again RETRY_SECONDS later, once
    assert calls == [(25, "calm", "w1"), (25, "busy", "w1"), (55, "busy", "w1"), (75, "calm", "w1"),
                     (75, "busy", "w1")]
    assert watching.RETRY_SECONDS == 30
    assert [m for m in said if "could not respond" in m] == [
        "falkirk watch: busy: could not respond to the loss of w1: RuntimeError: DAG 'busy' is being recovered by "
        "plan p0 (trying again in 30s)"]
    assert sum("w1 has not answered for more than 15s: lost" in m for m in said) == 2
