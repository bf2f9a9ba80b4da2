"""The DAG-parse checks of sender-side logs (scenario S10), through Airflow's
own DagBag: a DAG the protocol cannot run on fails to import, naming the tasks and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

DAG = '''
from datetime import datetime, timedelta, timezone
from airflow.sdk import DAG
from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.policies import Batch, EpochClock, SenderLog

CLOCK = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))

def task(task_id, regime):
    return RegimeSparkSubmitOperator(task_id=task_id, application="falkirk.spark_jobs.regions.clean", regime=regime)

with DAG("{dag_id}", schedule=None, default_args={{"epoch_clock": CLOCK}}):
    A = task("A", Batch(log_outputs=True))
    B = task("B", SenderLog(release={{"A": "immediate"}}))
    C = task("C", SenderLog(release={{"A": "immediate"}}))
    {body}
'''


def parse(tmp_path: Path, body: str):
    from airflow.dag_processing.dagbag import DagBag

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "checked.py").write_text(DAG.format(dag_id="checked", body=body))
    return DagBag(str(dags))


def test_a_shortcut_edge_is_refused_naming_the_tasks_and_the_walk_lengths(tmp_path: Path) -> None:
    bag = parse(tmp_path, 'D = task("D", SenderLog(release={"A": "at_end", "B": "immediate"}))\n    A >> B >> D\n'
                          '    A >> D')
    assert "checked" not in bag.dags
    [error] = bag.import_errors.values()
    assert "data edges from A to D: walks of lengths [1, 2] (A -> D; A -> B -> D)" in error, error
    assert "drop the edge A >> D" in error, error


def test_a_cycle_is_refused(tmp_path: Path) -> None:
    bag = parse(tmp_path, "A >> B >> A")
    assert "checked" not in bag.dags
    [error] = bag.import_errors.values()
    assert "cycle" in error.lower(), error


def test_the_diamond_is_accepted_and_its_segments_are_the_papers(tmp_path: Path) -> None:
    from falkirk.plugins.sender_logs import data_edges
    from falkirk.policies.sender_logs.graph import check_uniform

    bag = parse(tmp_path, 'D = task("D", SenderLog(release={"B": "immediate", "C": "at_end"}))\n'
                          '    A >> [B, C] >> D')
    assert bag.import_errors == {}
    segments = check_uniform(data_edges(bag.dags["checked"]))
    assert [(s.central, s.sources, s.sinks) for s in segments] == [("B", ("A",), ("D",)), ("C", ("A",), ("D",))]


@pytest.mark.parametrize("body, message", [
    ('D = task("D", SenderLog(release={"B": "immediate"}))\n    A >> [B, C] >> D',
     "task 'D': release= names ['B'] but the task reads ['B', 'C']; give one release policy per input"),
    ('A >> B\n    A >> C\n    E = task("E", SenderLog(release={"B": "window(0)"}))',
     "sender_log: release of input 'B': Window(k=0): k is the number of blocks the state depends on"),
])
def test_a_release_that_does_not_fit_the_task_is_refused_naming_it(tmp_path: Path, body: str, message: str) -> None:
    bag = parse(tmp_path, body)
    assert "checked" not in bag.dags
    [error] = bag.import_errors.values()
    assert message in error, error
