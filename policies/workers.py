"""Workers: the machines that run task instances, each with a scratch tier of its own.

A worker's name is ``FALKIRK_WORKER`` where it is set (several workers on one host, as in
:mod:`devstack.cluster`), else the host's fully qualified name. Airflow records it as a task
instance's hostname when ``[core] hostname_callable`` is ``falkirk.policies.workers.worker_name``,
so Airflow's grid and Falkirk's ledger name the same machine.

>>> worker_name({"FALKIRK_WORKER": "worker-a"})
'worker-a'
>>> worker_name({}) == socket.getfqdn()
True
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

WORKER_ENV = "FALKIRK_WORKER"
WORKERS_ENV = "FALKIRK_WORKERS"


def worker_name(environ: Mapping[str, str] | None = None) -> str:
    """The name of the worker this process runs on."""
    env = os.environ if environ is None else environ
    return env.get(WORKER_ENV, "").strip() or socket.getfqdn()


def configured_workers(environ: Mapping[str, str]) -> tuple[str, ...]:
    """``FALKIRK_WORKERS``: the workers (and queue names) placement may choose from, comma-separated.

    >>> configured_workers({"FALKIRK_WORKERS": "worker-a, worker-b"})
    ('worker-a', 'worker-b')
    """
    return tuple(w.strip() for w in environ.get(WORKERS_ENV, "").split(",") if w.strip())


def pair_workers(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The workers process pairs are placed on: ``FALKIRK_WORKERS``, or this machine alone.

    >>> pair_workers({"FALKIRK_WORKERS": "w0,w1"}), pair_workers({"FALKIRK_WORKER": "solo"})
    (('w0', 'w1'), ('solo',))
    """
    env = os.environ if environ is None else environ
    return configured_workers(env) or (worker_name(env),)
