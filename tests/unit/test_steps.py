"""Checkpoints inside an epoch: the step log, which checkpoints a new attempt may resume
from, and crash points that fire once (the part of :mod:`falkirk.spark_jobs.steps` that needs no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from falkirk.policies.faults import crash_requested
from falkirk.policies.ids import CommitId, ProcessorId
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.steps import StepCheckpoint, StepLog, latest_usable


def commit(task: str, epoch: int, incarnation: int = 0) -> CommitId:
    return CommitId(dag="d", processor=ProcessorId(task=task), epoch=epoch, incarnation=incarnation)


LINKS_2 = commit("links", 2)


def checkpoint(step: int, deps=(LINKS_2,), of: int = 30, kind: str = "iteration",
               epoch: int = 2, incarnation: int = 0) -> StepCheckpoint:
    return StepCheckpoint(dag_id="d", task_id="rank", map_index=-1, epoch=epoch, incarnation=incarnation, kind=kind, step=step, of=of, uri=f"/s/d/rank/steps-{kind}-{step}",
                          tier="durable", version=0, rows=40, depends_on=deps)


def test_the_step_log_keeps_each_checkpoint_once_per_incarnation(tmp_path: Path) -> None:
    log = StepLog(StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch")))
    for step in (5, 10, 5):
        log.append(checkpoint(step))
    log.append(checkpoint(5, incarnation=1))
    log.append(checkpoint(5, epoch=3))
    assert [(c.time, c.incarnation) for c in log.of_epoch("d", "rank", -1, 2)] == [((2, 5), 0), ((2, 10), 0),
                                                                                   ((2, 5), 1)]
    assert [c.step for c in log.of_epoch("d", "rank", -1, 2, incarnation=0)] == [5, 10]
    assert log.of_epoch("d", "rank", -1, 2)[0].depends_on == (LINKS_2,)
    assert [c.time for c in log.of_task("d", "rank", -1, through=2)] == [(2, 5), (2, 10), (2, 5)]
    assert len(log.of_dag("d")) == 4 and log.of_dag("other") == []


def test_a_checkpoint_built_on_a_rolled_back_or_redone_row_is_not_resumed_from() -> None:
    early, late = checkpoint(5), checkpoint(10, deps=(LINKS_2, commit("rank", 1)))
    current = {LINKS_2, commit("rank", 1)}
    assert latest_usable([early, late], "iteration", 30, set(), current) == [late, early]
    # rank's epoch 1 was rolled back by a recovery: only the checkpoint that did not read it remains
    assert latest_usable([early, late], "iteration", 30, {commit("rank", 1)}, current) == [early]
    # links' epoch 2 was redone as incarnation 1 since: neither checkpoint read it
    assert latest_usable([early, late], "iteration", 30, set(), {commit("links", 2, 1), commit("rank", 1)}) == []
    # another kind or count of steps (the job changed) is never resumed from
    assert latest_usable([early], "iteration", 20, set(), current) == [] == latest_usable([early], "chunk", 30, set(),
                                                                                          current)


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "loop"}, "kind='loop': one of iteration, chunk"),
    ({"step": 31}, "step=31: between 1 and of=30"),
])
def test_a_malformed_step_checkpoint_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        checkpoint(**{"step": 5, **kwargs})


def test_a_once_entry_fires_once_and_leaves_the_others_armed(tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    faults.write_text("loops/rank:2:iteration-13:once,tally:3:chunk-4-after-files\n")
    setting = f"@{faults}"
    assert not crash_requested("rank", 2, "iteration-13", setting, dag_id="other")
    assert crash_requested("rank", 2, "iteration-13", setting, dag_id="loops")
    assert not crash_requested("rank", 2, "iteration-13", setting, dag_id="loops")  # taken out as it fired
    assert faults.read_text() == "tally:3:chunk-4-after-files\n"
    assert crash_requested("tally", 3, "chunk-4-after-files", setting) and crash_requested(
        "tally", 3, "chunk-4-after-files", setting)  # not once: fires every time
    with pytest.raises(ValueError, match="':once' needs the entries in a file"):
        crash_requested("rank", 2, "iteration-13", "rank:2:iteration-13:once")
    with pytest.raises(ValueError, match="unknown step 'iteration-0'"):
        crash_requested("rank", 2, "iteration-0", "rank:2:iteration-0")


def test_once_entries_firing_at_the_same_moment_each_fire_once(tmp_path: Path) -> None:
    """Eight jobs hit their crash points at once, each its own ``:once`` entry: each entry is
    taken out exactly once (none written back by a job that read the file before another's
    removal), so none fires again."""
    import multiprocessing

    tasks = [f"t{i}" for i in range(8)]
    path = tmp_path / "faults"
    path.write_text("".join(f"{t}:1:before-commit:once\n" for t in tasks))
    context = multiprocessing.get_context("fork")
    barrier, fired = context.Barrier(len(tasks)), context.Array("b", len(tasks))

    def fire(i: int) -> None:
        barrier.wait()
        fired[i] = crash_requested(tasks[i], 1, "before-commit", f"@{path}")

    jobs = [context.Process(target=fire, args=(i,)) for i in range(len(tasks))]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(60)
    assert list(fired) == [1] * len(tasks)
    assert path.read_text() == ""
