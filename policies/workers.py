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
from typing import Mapping

WORKER_ENV = "FALKIRK_WORKER"


def worker_name(environ: Mapping[str, str] | None = None) -> str:
    """The name of the worker this process runs on."""
    env = os.environ if environ is None else environ
    return env.get(WORKER_ENV, "").strip() or socket.getfqdn()
