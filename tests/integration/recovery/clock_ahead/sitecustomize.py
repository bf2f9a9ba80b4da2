"""Imported by every interpreter started with this directory on ``PYTHONPATH``: its wall clock
runs ``FALKIRK_TEST_CLOCK_AHEAD_SECONDS`` ahead, as on a worker whose clock is wrong:
``time.time``, and ``datetime.now`` as the package's store modules call it to stamp the rows
they write (``committed_at``, ``completed_at``). Monotonic clocks and sleeps are untouched.

A test-only stand-in for a machine's bad clock; nothing in the package refers to it. (The
class ``datetime.datetime`` itself stays: compiled modules such as pandas' build on it.
libfaketime cannot stand in either: it breaks this Python's sleeps.)
"""

import datetime as _datetime
import os
import time as _time

_AHEAD = float(os.environ.get("FALKIRK_TEST_CLOCK_AHEAD_SECONDS", "0") or 0)

if _AHEAD:
    _real_time, _real_time_ns = _time.time, _time.time_ns
    _time.time = lambda: _real_time() + _AHEAD
    _time.time_ns = lambda: _real_time_ns() + int(_AHEAD * 1_000_000_000)

    class _AheadDateTime(_datetime.datetime):
        __slots__ = ()

        @classmethod
        def now(cls, tz=None):  # noqa: ANN001, ANN206
            return _datetime.datetime.fromtimestamp(_time.time(), tz)

    import falkirk.policies.store.control as _control
    import falkirk.policies.store.ledger as _ledger
    import falkirk.policies.store.steps as _steps

    for _module in (_ledger, _control, _steps):
        _module.datetime = _AheadDateTime
