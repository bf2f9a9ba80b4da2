"""``falkirk new-job NAME``: a job and a DAG to start from, in your own Airflow project.

It writes two files (and refuses to overwrite either):

* ``jobs/NAME.py``: a Spark job, one epoch at a time. ``compute(ctx)`` reads the epoch's input
  and, for a stateful task, the state the previous epoch left, and returns an ``EpochResult``
  with its outputs (and new state); ``run_job(compute)`` does the rest (reads the ledger,
  refuses what must not run, commits the epoch once);
* ``dags/NAME.py``: a DAG of two tasks on an epoch clock: ``NAME_source`` (``Batch``, its
  outputs logged) and ``NAME`` (``EagerCheckpoint``: a running count, checkpointed every epoch),
  both running that job file.

The job counts words in the lines of its epoch (made up from the epoch number, so that the
first run needs no data): replace ``lines_of`` with your own source.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> [p.relative_to(root).as_posix() for p in new_job("word_count", root)]
['jobs/word_count.py', 'dags/word_count.py']
"""

from __future__ import annotations

import importlib.util
import keyword
import re
import sys
from datetime import date
from pathlib import Path

JOB = '''"""{name}: one epoch of a Falkirk task, as a Spark job.

Run as the DAG's task ``{name}_source`` it makes the epoch's lines; run as ``{name}`` it counts
their words, adding to the counts of the epochs before (its state). Airflow runs it with the
epoch on the command line; ``run_job`` reads the ledger, restores the state and commits the
epoch's outputs and state once (a retry of a committed epoch changes nothing).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job


def lines_of(ctx: EpochContext) -> DataFrame:
    """The epoch's input. Replace it with your source, read for this epoch only (a partition of
    a table, the files that arrived in the epoch's interval): ctx.epoch is the epoch's number."""
    text = [f"epoch {{ctx.epoch}} of the falkirk wheel", "the wheel turns one epoch at a time"]
    return ctx.spark.createDataFrame([(line,) for line in text], "line string")


def compute(ctx: EpochContext) -> EpochResult:
    if ctx.args.task_id.endswith("_source"):
        return EpochResult(outputs={{"output": lines_of(ctx)}})
    lines = ctx.read_input()  # the upstream task's output of this epoch
    words = (lines.select(F.explode(F.split("line", " ")).alias("word"))
             .groupBy("word").agg(F.count("*").alias("n")))
    previous = ctx.previous_state()  # the counts through the previous epoch; None in the first
    if previous is None:
        previous = ctx.spark.createDataFrame([], "word string, total long")
    totals = (previous.join(words, "word", "full_outer")
              .select("word", (F.coalesce("total", F.lit(0)) + F.coalesce("n", F.lit(0))).cast("long").alias("total")))
    return EpochResult(outputs={{"output": totals}}, state=totals)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
'''

DAG_FILE = '''"""{name}: an Airflow DAG of Falkirk tasks; each DAG run is one epoch.

Trigger it at an epoch's logical date (midnight UTC from {first}): the next epoch after the
DAG's latest run (``falkirk trigger --dag {name}`` picks it). A backfill needs
``--reprocess-behavior failed`` (its tasks depend on their past, so Airflow refuses ``none``): it
then creates the epochs that have no run, and runs failed ones again. Recover from a failure with the Falkirk view (the DAG's "Falkirk" tab) or
``falkirk plan`` / ``falkirk replay``.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EagerCheckpoint, EpochClock

EPOCHS = EpochClock(first=datetime({year}, {month}, {day}, tzinfo=timezone.utc), period=timedelta(days=1))
JOB = str(Path(__file__).resolve().parents[1] / "jobs" / "{name}.py")

with DAG(
    dag_id="{name}",
    schedule=EpochTimetable(EPOCHS),  # a run per epoch, triggered; dates off the grid are refused
    start_date=EPOCHS.first,
    catchup=False,
    max_active_runs=1,  # a stateful task builds epoch t on epoch t-1
    tags=["falkirk"],
    doc_md=__doc__,
):
    source = RegimeSparkSubmitOperator(task_id="{name}_source", application=JOB, regime=Batch(log_outputs=True))
    counts = RegimeSparkSubmitOperator(task_id="{name}", application=JOB, regime=EagerCheckpoint())
    source >> counts
'''


class ScaffoldError(ValueError):
    """A job that cannot be scaffolded as asked; the message names the fix."""


def new_job(name: str, project: Path | str = ".", first: str = "2026-01-01") -> list[Path]:
    """Write ``jobs/NAME.py`` and ``dags/NAME.py`` under ``project``; returns their paths.
    Every argument is checked before anything is written (:class:`ScaffoldError` names it)."""
    check_name(name)
    day = _first_day(first)
    root = Path(project)
    files = {root / "jobs" / f"{name}.py": JOB.format(name=name),
             root / "dags" / f"{name}.py": DAG_FILE.format(name=name, first=first, year=day.year,
                                                           month=day.month, day=day.day)}
    existing = [str(p) for p in files if p.exists()]
    if existing:
        raise ScaffoldError(f"{', '.join(existing)} already exists; choose another NAME or move it away "
                            f"(nothing was written)")
    blocked = next((p for p in (root, *root.parents) if p.exists()), None)
    if blocked is not None and not blocked.is_dir():
        raise ScaffoldError(f"--project {str(project)!r:.80}: {blocked} is not a directory; give your Airflow "
                            f"project's directory (nothing was written)")
    try:
        for path in files:
            path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScaffoldError(f"--project {str(project)!r:.80}: cannot make {exc.filename}: {exc.strerror}; give a "
                            f"directory you may write to (nothing was written)") from None
    for path, text in files.items():
        path.write_text(text)
    return list(files)


def check_name(name: str) -> str:
    """``name`` if it can be the job's module and the DAG's id: lower-case, not a Python keyword,
    and not the name of a module the job or the DAG imports (or any other importable one): a file
    ``jobs/json.py`` is found before the standard library's ``json`` by the job run as a script,
    and ``dags/airflow.py`` before Airflow by the dag-processor.

    >>> check_name("word_count")
    'word_count'
    >>> check_name("json")
    Traceback (most recent call last):
    ...
    falkirk.plugins.scaffold.ScaffoldError: NAME 'json': a module of that name is importable here (the standard library's), and jobs/json.py and dags/json.py would hide it from the job and the DAG; choose another name, e.g. json_job
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", name) or keyword.iskeyword(name):
        raise ScaffoldError(f"NAME {name!r:.80}: use lower-case letters, digits and _ (a Python module and DAG id), "
                            f"e.g. word_count")
    if name in sys.stdlib_module_names or importlib.util.find_spec(name) is not None:
        whose = "the standard library's" if name in sys.stdlib_module_names else "an installed package's"
        raise ScaffoldError(f"NAME {name!r}: a module of that name is importable here ({whose}), and jobs/{name}.py "
                            f"and dags/{name}.py would hide it from the job and the DAG; choose another name, "
                            f"e.g. {name}_job")
    return name


def _first_day(first: str) -> date:
    """The first epoch's date, written ``YYYY-MM-DD``.

    >>> _first_day("2026-13-01")
    Traceback (most recent call last):
    ...
    falkirk.plugins.scaffold.ScaffoldError: --first '2026-13-01': give the first epoch's date as YYYY-MM-DD, a day of the calendar (e.g. 2026-01-01)
    """
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", first):
            raise ValueError(first)
        return date.fromisoformat(first)
    except ValueError:
        raise ScaffoldError(f"--first {first!r:.40}: give the first epoch's date as YYYY-MM-DD, a day of the "
                            f"calendar (e.g. 2026-01-01)") from None


__all__ = ["ScaffoldError", "check_name", "new_job"]
