"""A task process's exit, noticed by Airflow's task supervisor when it happens.

Airflow's supervisor (``airflow.sdk.execution_time.supervisor.WatchedSubprocess``) waits on its
task process in ``select`` over the process's sockets. The process's exit is no event there: when
the sockets close before the process can be reaped, the supervisor finds the exit only when its
``select`` times out, ``[workers] min_heartbeat_interval`` later (an integer, so a second at
least). Until then the executor's slot stays taken: on a Celery worker of two slots, a third of
the task instances held theirs a second past their end. On Linux a pidfd (``os.pidfd_open``) is
readable once its process has exited; registered in the supervisor's selector beside the
sockets, it wakes the supervisor at the exit.

:func:`watch_task_exits` installs it for every supervisor the process starts afterwards (and the
processes it forks); elsewhere than Linux it changes nothing.
"""

from __future__ import annotations

import os
import selectors
import weakref
from typing import Any

_INSTALLED = "_falkirk_watches_exit"


class ExitWatch:
    """A pidfd as the selector's file object: readable once its process has exited. Its fd is
    closed once, by :meth:`close` or when the watch is collected: a supervisor that found the
    exit at its timeout drops its selector with the watch still in it, and a worker's process
    supervises task after task."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._close = weakref.finalize(self, os.close, fd)

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        self._close()


def watch_exit(selector: selectors.BaseSelector, pid: int) -> ExitWatch | None:
    """Register ``pid``'s exit in ``selector`` as an event in the supervisor's form (a reader that
    wants no more, then the close that unregisters it); None where pidfds are not available.

    >>> import subprocess, selectors, sys
    >>> child = subprocess.Popen([sys.executable, "-c", "pass"])
    >>> selector = selectors.DefaultSelector()
    >>> watch = watch_exit(selector, child.pid)
    >>> [key.fileobj is watch for key, _ in selector.select(timeout=10)]
    [True]
    >>> child.wait()
    0
    """
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        watch = ExitWatch(pidfd_open(pid))
    except OSError:  # no pidfds in this kernel: the supervisor's timeout still finds the exit
        return None
    selector.register(watch, selectors.EVENT_READ, (lambda _watch: False, selector.unregister))
    return watch


def watch_task_exits() -> bool:
    """Make every Airflow supervisor started from now on wake at its process's exit; True if it
    does (idempotent), False where this Airflow has no supervisor in the form it expects."""
    from airflow.sdk.execution_time.supervisor import WatchedSubprocess

    register = getattr(WatchedSubprocess, "_register_pipe_readers", None)
    if register is None:
        return False
    if getattr(register, _INSTALLED, False):
        return True

    def _register_pipe_readers(self: Any, *args: Any, **kwargs: Any) -> None:
        register(self, *args, **kwargs)
        watch_exit(self.selector, self.pid)

    setattr(_register_pipe_readers, _INSTALLED, True)
    WatchedSubprocess._register_pipe_readers = _register_pipe_readers  # type: ignore[method-assign]
    return True
