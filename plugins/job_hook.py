"""Running a job's process for a task instance, as the Spark provider's hooks do for theirs.

:class:`FalkirkJobHook` owns the job's process: it resolves the Spark connection, chooses the
backend for it, streams the job's output into the task's log, and kills the job when Airflow
kills the task. On a ``spark_connect`` connection the job runs as a Spark Connect client:

* on this worker's job host (:mod:`falkirk.policies.job_host`), a warm interpreter that has
  imported PySpark, pandas, pyarrow and delta-rs once and forks a child per job: the default;
* in a fresh interpreter (``FALKIRK_JOB_HOST=off``, or when the host cannot start), which
  pays those imports on every task instance.

Any other Spark connection goes through ``spark-submit`` (the operator's base class, the
provider's ``SparkSubmitHook``).

Example::

    hook = FalkirkJobHook("spark_default", on_line=print)
    code = hook.run_connect("/jobs/aggregate.py", ["--dag-id", "orders", ...], env)
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from falkirk.policies.asset_events import CommittedEpoch
from falkirk.policies.job_host import JobHost, JobHostError, enabled
from falkirk.policies.job_spec import REFUSAL_PREFIX
from falkirk.policies.lineage import TableRead, parse_reads_line

log = logging.getLogger(__name__)


class FalkirkJobHook:
    """Runs one job as a Spark Connect client of ``conn_id`` and reports its exit code.

    ``refusal`` holds the job's refusal (see :data:`falkirk.policies.job_spec.REFUSED_EXIT_CODE`)
    once it has printed one; ``committed``, the commit it made or found made
    (:class:`~falkirk.policies.asset_events.CommittedEpoch`), once it has printed that; ``reads``,
    the committed tables it read (:class:`~falkirk.policies.lineage.TableRead`), for lineage.
    """

    def __init__(self, conn_id: str, on_line: Callable[[str], None] = log.info) -> None:
        self.conn_id = conn_id
        self.log = on_line
        self.refusal: str | None = None
        self.committed: CommittedEpoch | None = None
        self.reads: tuple[TableRead, ...] = ()
        self._pid: int | None = None
        self._proc: subprocess.Popen[str] | None = None

    def connection_url(self) -> str:
        """The ``sc://host:port`` URL of the connection's Spark Connect server."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        return SparkConnectHook(conn_id=self.conn_id).get_connection_url()

    def run_connect(self, application: str, args: Sequence[str], env: Mapping[str, str],
                    spark_conf: Mapping[str, Any] | None = None, preload: Sequence[str] = ()) -> int:
        """Run ``application`` with ``args`` as a client of the connection's server; returns its
        exit code (negative: killed by that signal). On the job host, ``preload`` names the
        modules every such job imports, which a host of their own imports once."""
        url = self.connection_url()
        confs = ",".join(f"{k}={v}" for k, v in sorted((spark_conf or {}).items()))
        job_env = {**os.environ, **env, "SPARK_REMOTE": url, "FALKIRK_SPARK_CONF": confs}
        argv = [application, *args]
        if enabled(job_env):
            try:
                host = JobHost(environ=job_env, preload=preload)
                self.log(f"Spark Connect client of {url} on the job host {host.socket_path}: {' '.join(argv)}")
                return host.run(argv, job_env, on_line=self._line, on_started=self._started)
            except JobHostError as exc:
                if self._pid is not None:  # the job started: running it again is not this hook's call
                    raise
                self.log(f"the job host is not available ({exc}); running the job in a fresh interpreter")
        return self._run_process([sys.executable, *argv], job_env, url)

    def _run_process(self, argv: list[str], env: Mapping[str, str], url: str) -> int:
        self.log(f"Spark Connect client of {url}: {' '.join(argv)}")
        self._proc = subprocess.Popen(argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._line(line.rstrip("\n"))
        return self._proc.wait()

    def _started(self, pid: int) -> None:
        self._pid = pid

    def _line(self, line: str) -> None:
        if line.startswith(REFUSAL_PREFIX):  # the job's refusal, one line of it per output line
            said = line[len(REFUSAL_PREFIX):]
            self.refusal = said if self.refusal is None else f"{self.refusal}\n{said}"
        self.committed = CommittedEpoch.parse_line(line) or self.committed
        self.reads = parse_reads_line(line) or self.reads
        self.log(line)

    def on_kill(self) -> None:
        """Kill the running job (and what it started)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._pid is not None:
            for kill in (lambda: os.killpg(self._pid, signal.SIGKILL), lambda: os.kill(self._pid, signal.SIGKILL)):
                try:
                    kill()
                    break
                except (ProcessLookupError, PermissionError):
                    continue
