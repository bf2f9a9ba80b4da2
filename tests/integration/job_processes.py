"""Jobs that run as processes side by side, each a Spark Connect client with a log file of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


class JobProcesses:
    """Start ``python -m MODULE ROLE COMMON... ARGS...`` against one Spark Connect server.

    Logs go to ``logs/NN-ROLE[-LABEL].log`` in start order; ``crash`` sets ``FALKIRK_CRASH_AT``.
    """

    def __init__(self, module: str, remote: str, logs: Path, common: list[str]) -> None:
        self.module, self.remote, self.log_dir, self.common = module, remote, logs, common
        self.log_dir.mkdir(exist_ok=True)
        self.count = 0

    def start(self, role: str, *args: str, crash: str = "", label: str = "") -> subprocess.Popen:
        self.count += 1
        log = open(self.log_dir / f"{self.count:02d}-{role}{'-' + label if label else ''}.log", "w")
        env = {**os.environ, "SPARK_REMOTE": self.remote, "FALKIRK_CRASH_AT": crash, "PYTHONUNBUFFERED": "1"}
        return subprocess.Popen([sys.executable, "-m", self.module, role, *self.common, *args],
                                env=env, stdout=log, stderr=subprocess.STDOUT)

    def run(self, role: str, *args: str, label: str = "") -> None:
        code = self.start(role, *args, label=label).wait(timeout=300)
        assert code == 0, f"{role} {args} exited {code}; logs in {self.log_dir}"

    def text(self, pattern: str = "*") -> str:
        """The logs whose names match ``pattern``, in start order."""
        return "\n".join(p.read_text() for p in sorted(self.log_dir.glob(f"{pattern}.log")))
