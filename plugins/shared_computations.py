"""Identical requests asked at once share one computation, and none gets an answer older than itself.

A preview reads the store and plans (a tenth of a second or more); fifty people opening the same
view at once would otherwise queue fifty plans behind the interpreter's lock. Plain caching would
answer from reads made before a request arrived, and a plan must not be older than the question:
a scratch directory may have been lost a moment ago. So a request joins a computation only if
that computation starts after the request arrived: while one runs, every new request for the
same key waits for the *next* one, which starts as soon as the running one ends. A burst of
requests costs at most two computations, and each answer is read after its request came in.

>>> import threading, time
>>> shared = SharedComputations()
>>> runs = []
>>> def plan():
...     runs.append(1)
...     time.sleep(0.2)
...     return len(runs)
>>> answers = []
>>> threads = [threading.Thread(target=lambda: answers.append(shared("dag", plan))) for _ in range(20)]
>>> for t in threads: t.start()
>>> for t in threads: t.join()
>>> len(runs) <= 2, sorted(set(answers)) in ([1], [1, 2])
(True, True)
>>> shared("dag", plan) == len(runs)   # alone, a request computes afresh
True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any


class _Computation:
    """One run of a computation: the requests that wait for it, and its outcome."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class SharedComputations:
    """Runs ``compute`` for a key, sharing each run with the requests that arrived before it began."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[Hashable, _Computation] = {}
        self._next: dict[Hashable, _Computation] = {}

    def __call__(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()``'s value (or its exception) from a run that started after this call did."""
        with self._lock:
            running = self._running.get(key)
            if running is None:
                mine, leads, after = self._running.setdefault(key, _Computation()), True, None
            else:
                leads = key not in self._next
                mine, after = self._next.setdefault(key, _Computation()), running
        if not leads:
            mine.done.wait()
            return mine.outcome()
        if after is not None:
            after.done.wait()  # the run in progress began before this call: wait for it, then run anew
        try:
            mine.value = compute()
        except BaseException as exc:  # noqa: BLE001 (each waiter gets what the run raised)
            mine.error = exc
        finally:
            with self._lock:
                # The next run (if any request is waiting for one) becomes the running one before
                # this one is marked done, so a request arriving now joins a run after it.
                following = self._next.pop(key, None)
                if following is not None:
                    self._running[key] = following
                else:
                    del self._running[key]
            mine.done.set()
        return mine.outcome()
