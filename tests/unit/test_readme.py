"""The README's DAG is a DAG: its code runs and gives the two tasks and regimes it describes."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_is_short_and_its_dag_defines_two_tasks_under_two_regimes(tmp_path: Path) -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 120
    for section in ("## Requirements", "## Install", "## A DAG", "## After a failure", "## Docs"):
        assert section in text, section
    [code] = re.findall(r"```python\n(.*?)```", text, re.S)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "word_count.py").write_text("")  # what `falkirk new-job word_count` writes
    scope: dict = {"__file__": str(tmp_path / "dags" / "word_count.py")}
    exec(compile(code, str(README), "exec"), scope)
    from falkirk.plugins.operators import regime_of

    dag = scope["source"].dag  # the DAG the `with` block made
    assert {t.task_id: regime_of(t).spec() for t in dag.tasks} == {
        "source": "batch(log_outputs=true)", "counts": "eager_checkpoint"}
    assert dag.task_dict["counts"].upstream_task_ids == {"source"}
