"""What a job tells its log: one line on stderr, prefixed ``[falkirk]``, flushed at once (the
Airflow task log interleaves it with Spark's own output, and a SIGKILL must not lose it).

>>> import contextlib, io, sys
>>> err = io.StringIO()
>>> with contextlib.redirect_stderr(err):
...     say("rank epoch 3: resuming at iteration 10 of 30")
>>> err.getvalue()
'[falkirk] rank epoch 3: resuming at iteration 10 of 30\\n'
"""

from __future__ import annotations

import sys


def say(message: str) -> None:
    """Print ``message`` to the job's log."""
    print(f"[falkirk] {message}", file=sys.stderr, flush=True)
