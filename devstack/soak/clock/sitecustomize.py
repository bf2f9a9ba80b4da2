"""Imported by every interpreter the soak's shape starts (this directory is on its
``PYTHONPATH``). On a Celery worker (``FALKIRK_WORKER``), and in everything it starts, the wall
clock runs ahead by the seconds written in ``$FALKIRK_SOAK_CLOCKS/<worker>``: the nemesis's
``clock-shift`` writes them, and 0 when the hold ends. The file is read again at most once a
second, so warm processes (the job host and the jobs it forks) shift too.

Shifted: ``time.time``, ``time.time_ns``, and ``datetime.now`` as the package's store modules call
it to stamp the rows they write. Monotonic clocks and sleeps are untouched. A stand-in for a
machine's bad clock, for the soak only (libfaketime cannot stand in: it breaks this Python's
sleeps); nothing in the package refers to it.
"""

import os

_CLOCKS = os.environ.get("FALKIRK_SOAK_CLOCKS", "")
_WORKER = os.environ.get("FALKIRK_WORKER", "")

if _CLOCKS and _WORKER:
    import datetime as _datetime
    import time as _time

    _path = os.path.join(_CLOCKS, _WORKER)
    _real_time, _real_time_ns, _monotonic = _time.time, _time.time_ns, _time.monotonic
    _read = [float("-inf"), 0.0]  # when the file was last read (monotonic), and the seconds ahead

    def _ahead() -> float:
        now = _monotonic()
        if now - _read[0] >= 1.0:
            try:
                with open(_path, encoding="utf-8") as f:
                    _read[1] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                _read[1] = 0.0
            _read[0] = now
        return _read[1]

    _time.time = lambda: _real_time() + _ahead()
    _time.time_ns = lambda: _real_time_ns() + int(_ahead() * 1_000_000_000)

    class _AheadDateTime(_datetime.datetime):
        __slots__ = ()

        @classmethod
        def now(cls, tz=None):  # noqa: ANN001, ANN206
            return _datetime.datetime.fromtimestamp(_time.time(), tz)

    import falkirk.policies.store.control as _control
    import falkirk.policies.store.ledger as _ledger
    import falkirk.policies.store.steps as _steps

    for _module in (_ledger, _control, _steps):
        _module.datetime = _AheadDateTime  # type: ignore[attr-defined, misc]
