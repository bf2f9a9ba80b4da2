"""Airflow's side of process pairs: take-over, catch-up onto a spare, and the readers' trigger rule.

* :func:`take_over`: a worker (or one replica) is lost. The layout marks its replicas ``DEAD``,
  one generation on (:meth:`~falkirk.policies.pairs.Layout.fail`); each of their task instances
  that has not succeeded is set to skipped, with a note naming the twin that holds the
  partition. A DAG run left failed only by them is settled to success; one that Airflow failed
  as deadlocked (its instances waited on a failed replica, by ``depends_on_past``, which for a
  mapped task waits on every map index) is queued again. Nothing re-runs:
  the twins' outputs are already committed, and readers read them
  (:mod:`falkirk.spark_jobs.pairs`).
* :func:`catch_up`: each partition that lost a replica gets it back on a spare, bottom-up.
  The new replica is registered as a standby at its survivor's committed epoch ``v``, the
  survivor's state and outputs of the epochs it missed, through ``v``, are copied to it (so its
  checkpoints have no gap), and its skipped task instances after
  ``v`` are cleared: Airflow runs them on the spare (placement follows the layout), in order
  (``depends_on_past``). The last of them to commit folds the replica back in, once it has
  caught up with its survivor. Only the partitions that lost a replica are touched. A
  catch-up that stops part-way is run again: on the same spare, it resumes its standby (every
  copy is committed once); if the spare was lost, its take-over discarded the standby, and the
  catch-up registers a new one, a generation on, on another spare.
* :func:`dag_policy` (a cluster policy): a task that reads a paired task waits for its
  replicas to be done, not successful (``all_done``): a replica taken over ends skipped, and
  one on a lost worker may end failed before anyone declares it dead; the reader reads its twin.

The ``falkirk pairs`` command (:mod:`falkirk.plugins.cli`) calls these.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from falkirk.plugins import hookimpl
from falkirk.policies.faults import crash_point
from falkirk.policies.ids import IdError, ProcessorId, ReplicaId

if TYPE_CHECKING:
    from falkirk.policies.store.ledger import InputRef

log = logging.getLogger(__name__)

DONE = ("success", "skipped")


@hookimpl
def dag_policy(dag: Any) -> None:
    """Readers of a paired task run once its replicas are done (see the module docstring)."""
    from falkirk.plugins.task_metadata import regime_of

    paired = {t.task_id for t in dag.tasks if (r := regime_of(t)) is not None and r.replicas > 1}
    if not paired:
        return
    for task in dag.tasks:
        if set(task.upstream_task_ids) & paired and task.trigger_rule == "all_success":
            task.trigger_rule = "all_done"


@dataclass(frozen=True)
class TakeOver:
    """What a take-over did: the replicas it declared dead, the task instances it skipped
    (run id, processor) and the DAG runs it settled to success."""

    dead: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    settled: tuple[str, ...] = ()


def take_over(dag_id: str, store: Any, client: Any, *, worker: str | None = None,
              replica: str | None = None, reason: str = "declared by hand",
              progress: Callable[[str], None] = print) -> TakeOver:
    """Declare ``worker`` (all its replicas) or one ``replica`` (``task[p].R``) dead; see the module docstring."""
    from falkirk.policies.pairs import PairsError, Status
    from falkirk.policies.store.control import PairLayouts

    layouts = PairLayouts(store)
    before = layouts.load(dag_id)
    if before is None:
        raise PairsError(f"--dag {dag_id}: no process pairs are recorded for this DAG (has a ProcessPairs task run?)")
    if (worker is None) == (replica is None):
        raise PairsError("name the lost worker (--worker W) or one replica (--replica TASK[P].R), not both")
    if worker is not None:
        after = before.fail(worker)
    else:
        try:
            rid = ReplicaId.parse(replica or "")
        except IdError as exc:
            raise PairsError(f"--replica {exc}") from None
        after = before.fail_replica(rid.task, rid.partition, rid.replica)
    layouts.save(dag_id, after, before=before)
    dead = [r for r in after.replicas if r.status is Status.DEAD and r not in before.replicas]
    progress(f"{dag_id}: {', '.join(r.name for r in dead) or 'nothing new'} declared dead ({reason}); their twins "
             f"hold their partitions, nothing re-runs")
    skipped, touched = _skip_dead(dag_id, client, after, dead)
    for run, processor in skipped:
        progress(f"  {run}: {processor} skipped (taken over)")
    for task, partition in after.lost_partitions():
        a, b = ReplicaId.pair(task=task, partition=partition)
        progress(f"  {ReplicaId.partition_name(task, partition)} lost both replicas: its task instances stay failed "
                 f"(the epoch is not done without it); restore it on the durable path: falkirk plan --dag {dag_id} "
                 f"--failed-task {a.processor}:EPOCH --failed-task {b.processor}:EPOCH, then falkirk replay")
    settled = _settle(dag_id, client, touched)
    for run in settled:
        progress(f"  {run}: every task instance done: the DAG run is success")
    return TakeOver(tuple(r.name for r in dead), tuple(skipped), tuple(settled))


def _skip_dead(dag_id: str, client: Any, layout: Any, dead: Sequence[Any]) -> tuple[list[tuple[str, str]], set[str]]:

    # A replica whose twin is dead too is not taken over by anyone: its partition is lost, and its
    # failed instances stay failed until the durable path restores it.
    lost = set(layout.lost_partitions())
    wanted = {r.id.processor: r for r in dead
              if (r.task, r.partition) not in lost}
    skipped, touched = [], set()
    for run, instances in sorted(client.task_instances_by_run(dag_id).items()):
        for processor, ti in sorted(instances.items()):
            r = wanted.get(processor)
            if r is None or ti.get("state") in DONE:
                continue
            twin = next(t for t in layout.pair(r.task, r.partition) if t.replica != r.replica)
            client.set_state(dag_id, run, processor, "skipped",
                             note=f"Falkirk: replica {r.name} on {r.worker} declared dead (generation {r.generation}); "
                                  f"its twin {twin.name} holds the partition")
            skipped.append((run, processor))
            touched.add(run)
    return skipped, touched


def _settle(dag_id: str, client: Any, runs: set[str]) -> list[str]:
    from falkirk.plugins.airflow_rest import failed_runs
    from falkirk.policies.planning.replay_decisions import runs_to_settle

    decided = runs_to_settle(failed_runs(client, dag_id, runs))
    for run in decided.success:
        client.set_run_state(dag_id, run, "success", note="Falkirk: the replicas that failed were taken over by "
                                                          "their twins; every partition of this epoch is done")
    for run in (*decided.left, *decided.requeue):
        # Failed as deadlocked (its instances waited, by depends_on_past, on a failed replica):
        # queued again, the scheduler runs what the take-over unblocked.
        client.queue_run(dag_id, run, note="Falkirk: the replicas that failed were taken over by their twins; "
                                           "the rest of this epoch runs")
    return list(decided.success)


@dataclass
class CatchUp:
    """A catch-up under way: per recreated replica, its spare, the epoch its copied state is of,
    the bytes copied and the epochs cleared for it to replay."""

    replicas: list[dict[str, Any]] = field(default_factory=list)


def catch_up(dag_id: str, store: Any, client: Any, *, spare: str | None = None, workers: Sequence[str] = (),
             replaced: bool = False, wait: float = 300.0, progress: Callable[[str], None] = print) -> CatchUp:
    """Recreate every replica the layout has lost, on ``spare`` (else the first spare of
    ``workers``); ``replaced``: ``spare`` is a lost worker's name that a new machine took
    (:meth:`~falkirk.policies.pairs.Layout.register`); see the module docstring. Epochs may keep running meanwhile: the slot's task
    instances under way when its standby is registered are waited for (up to ``wait`` seconds)
    before those its dead predecessor left are cleared."""
    from falkirk.policies.pairs import PairsError, Status, catch_up_order, spares
    from falkirk.policies.store.control import PairLayouts
    from falkirk.policies.store.ledger import Ledger, LedgerSnapshot

    layouts = PairLayouts(store)
    layout = layouts.load(dag_id)
    if layout is None:
        raise PairsError(f"--dag {dag_id}: no process pairs are recorded for this DAG")
    snapshot = LedgerSnapshot(Ledger(store), dag_id)
    levels = _upstream_first(snapshot, sorted({r.task for r in layout.replicas}))
    todo = [(t, p) for t, p in catch_up_order(layout, levels) if (t, p) not in layout.lost_partitions()]
    if not todo:
        progress(f"{dag_id}: every pair has both replicas; nothing to catch up")
        return CatchUp()
    if spare is None:
        free = spares(layout, workers) if workers else []
        workers_held = sorted({r.worker for r in layout.replicas})
        if not free and len(workers_held) > 1:
            raise PairsError(f"no spare worker: every worker in {list(workers)} holds replicas or was lost; start "
                             f"one and name it with --spare (a lost worker comes back under a new name; a new "
                             f"machine under a lost worker's name is named with --spare NAME --replaced)")
        spare = free[0] if free else workers_held[0]
    done = CatchUp()
    for task, partition in todo:
        before = layouts.load(dag_id)
        if before is None:
            raise PairsError(f"--dag {dag_id}: its process pairs' layout is gone from the store; nothing to catch up")
        standby = next((r for r in before.pair(task, partition) if r.status is Status.STDBY), None)
        if standby is None:
            after = before.register(task, partition, spare, replaced=replaced)
            layouts.save(dag_id, after, before=before)
            standby = next(r for r in after.pair(task, partition) if r.status is Status.STDBY)
        else:  # registered by a catch-up that did not finish, on a spare that lives: resumed there
            after = before
            progress(f"{dag_id}: resuming the catch-up of {standby.name} on {standby.worker}")
        survivor = next(r for r in after.pair(task, partition) if r is not standby)
        record = _install(store, snapshot, dag_id, task, partition, survivor.replica, standby.replica)
        runs = _settled_slot(dag_id, client, task, partition, standby.replica, wait, progress)
        epochs = _run_epochs(dag_id, client, runs, snapshot)
        cleared = _clear_after(dag_id, client, runs, epochs, task, partition, standby.replica, record["epoch"])
        if not cleared and _fold_in_now(layouts, dag_id, task, partition, standby.replica, record["epoch"]):
            progress(f"{dag_id}: {standby.name} active again at once: no epoch after {record['epoch']} to replay")
        record.update(replica=standby.name, spare=standby.worker, generation=standby.generation, cleared=cleared)
        done.replicas.append(record)
        progress(f"{dag_id}: {standby.name} registered on {standby.worker} as a standby at epoch {record['epoch']} "
                 f"(generation {standby.generation}); copied {record['bytes']} bytes of {survivor.name}'s state and "
                 f"outputs (epochs {', '.join(map(str, record['epochs'])) or 'none'}); "
                 f"replaying epochs {', '.join(map(str, sorted(cleared))) or 'none'}")
    return done


def _fold_in_now(layouts: Any, dag_id: str, task: str, partition: int, replica: str, epoch: int) -> bool:
    """Make the standby active at once when the copy of the survivor's epochs through ``epoch`` left
    it nothing to replay (no DAG run after it): otherwise only its next commit would, and with no
    new epoch it would stay a standby. Returns whether it did; a survivor that went on meanwhile
    leaves it to its next commit."""
    from falkirk.policies.pairs import PairsError, Status

    before = layouts.load(dag_id)
    me = before.replica(task, partition, replica)
    if me.status is not Status.STDBY:
        return False
    try:
        after = before.advance(task, partition, replica, epoch, me.generation).fold_in(task, partition)
    except PairsError:
        return False
    layouts.save(dag_id, after, before=before)
    return True


def _upstream_first(snapshot: Any, tasks: list[str]) -> list[str]:
    """The paired tasks in the order their ledger rows read each other, upstream first."""

    reads: dict[str, set[str]] = {t: set() for t in tasks}
    for e in snapshot.entries():
        if e.task_id in reads:
            reads[e.task_id] |= {ProcessorId.parse(i.task_id).task for i in e.inputs if ProcessorId.parse(i.task_id).task in reads}
    order: list[str] = []
    while len(order) < len(tasks):
        ready = sorted(t for t in tasks if t not in order and reads[t] <= set(order) | {t})
        order += ready or sorted(t for t in tasks if t not in order)[:1]
    return order


def _install(store: Any, snapshot: Any, dag_id: str, task: str, partition: int, survivor: str,
             standby: str) -> dict[str, Any]:
    """Copy the survivor's state and outputs of every epoch the standby's replica missed, up to the
    survivor's latest committed epoch ``v``, to the standby's own tables (committed under the
    standby's key), with a ledger row each: the standby's next epoch restores from ``v``, and its
    checkpoints have no gap for a recovery to mistake for a failure. Epochs garbage collection has
    released of the survivor are not copied (their files are gone, and no recovery reads them)."""
    from falkirk.policies.store.control import Collections
    from falkirk.policies.store.ledger import Ledger

    src_index = ReplicaId(task=task, partition=partition, replica=survivor).map_index
    dst_index = ReplicaId(task=task, partition=partition, replica=standby).map_index
    current = snapshot.entries()
    rows = {e.epoch: e for e in current if e.task_id == task and e.map_index == src_index}
    if not rows:
        raise ValueError(f"{ReplicaId(task=task, partition=partition, replica=survivor)} has committed nothing yet: nothing to copy")
    held = {e.epoch for e in current if e.task_id == task and e.map_index == dst_index}
    v = max(rows)
    collected = Collections(store).through(dag_id).get(ProcessorId(task=task, map_index=src_index), 0)
    missed = [e for e in sorted(rows) if e not in held and e > max(held, default=0) and e > collected]
    totals = {"bytes": 0, "rows": {}}
    ledger = Ledger(store)
    own = [e for e in current if e.task_id == task and e.map_index == dst_index and e.epoch in held]
    read = max(own, key=lambda e: e.epoch).inputs if own else ()  # M̄ of the standby's own chain so far
    for epoch in missed:  # tables first, the ledger row last: a retry copies the epoch again, once
        row = _copied_row(store, snapshot, dag_id, rows[epoch], dst_index, totals, last=epoch == v)
        row = dataclasses.replace(row, inputs=carried_inputs(read, row.inputs))
        read = row.inputs
        crash_point("catch-up", epoch, "after-copy", dag_id=dag_id)
        ledger.append(row)
    return {"epoch": v, "epochs": missed, "bytes": totals["bytes"], "rows": totals["rows"],
            "from": ProcessorId(task=task, map_index=src_index)}


def carried_inputs(before: Sequence[InputRef], copied: Sequence[InputRef]) -> tuple[InputRef, ...]:
    """M̄ of a row copied from the survivor onto the standby's chain: per input (producer
    partition), the later of what the standby had consumed and what the survivor's row says. The
    twins may have read different replicas of a producer, and metadata never shrinks along a
    chain (a copy that dropped the standby's reads made every later plan of the DAG fail).

    >>> from falkirk.policies.store.ledger import InputRef
    >>> own = (InputRef(task_id="sessions", output="output", through=9, map_index=1), InputRef(task_id="sessions", output="output", through=3, map_index=0))
    >>> twin = (InputRef(task_id="sessions", output="output", through=10, map_index=0), InputRef(task_id="sessions", output="output", through=4, map_index=1))
    >>> [(i.processor, i.through) for i in carried_inputs(own, twin)]
    [('sessions[0]', 10), ('sessions[1]', 9)]
    """
    merged = {(i.task_id, i.output, i.map_index): i for i in before}
    for i in copied:
        had = merged.get((i.task_id, i.output, i.map_index))
        merged[i.task_id, i.output, i.map_index] = i if had is None else dataclasses.replace(
            i, through=max(i.through, had.through))
    return tuple(merged[k] for k in sorted(merged))


def _copied_row(store: Any, snapshot: Any, dag_id: str, source: Any, dst_index: int, totals: dict[str, Any],
                last: bool) -> Any:
    """The survivor's ``source`` row, its tables copied to the standby's (``dst_index``)."""
    from falkirk.policies.regimes import Tier
    from falkirk.policies.store.commits import CommitKey, commit_epoch, read_epoch
    from falkirk.policies.store.ledger import is_external

    incarnation = snapshot.next_incarnation(source.task_id, source.epoch, dst_index)
    key = CommitKey(dag_id=dag_id, task_id=source.task_id, epoch=source.epoch, map_index=dst_index, incarnation=incarnation)

    def copy(uri: str, name: str) -> tuple[str, int, int]:
        data = read_epoch(uri, source.epoch, store.options_for(uri))
        totals["bytes"] += data.nbytes
        if last:
            totals["rows"][name] = data.num_rows
        target = store.table_uri(Tier.DURABLE, dag_id, source.task_id, name, dst_index)
        result = commit_epoch(target, data, key, store.options_for(target))
        return target, result.version, data.num_rows

    outputs = []
    for ref in source.outputs:
        if is_external(ref.uri):  # the sink both replicas write once: named, not copied
            outputs.append(ref)
            continue
        uri, version, n = copy(ref.uri, ref.name)
        outputs.append(dataclasses.replace(ref, uri=uri, version=version, rows=n))
    state = copy(source.state_uri, "state") if source.state_uri else None
    return dataclasses.replace(
        source, map_index=dst_index, incarnation=incarnation, outputs=tuple(outputs),
        state_uri=state[0] if state else None, state_version=state[1] if state else None,
        state_rows=state[2] if state else None, run_id=f"catch-up:{source.run_id}", worker=None)


def _settled_slot(dag_id: str, client: Any, task: str, partition: int, replica: str, wait: float,
                  progress: Callable[[str], None]) -> dict[str, dict[str, dict[str, Any]]]:
    """The DAG's task instances by run, once none of the standby's slot is under way.

    One that started before the standby was registered read the replica as dead and ends
    skipped, or ran before the copies it restores from and ends failed: either way its epoch is
    the standby's to run, and is cleared only once it has ended (a clear of a running instance
    could race its end). One that starts after reads the standby and its copies."""
    from falkirk.plugins.airflow_rest import AirflowError

    processor = ReplicaId(task=task, partition=partition, replica=replica).processor
    deadline, said = time.monotonic() + wait, False
    while True:
        runs = client.task_instances_by_run(dag_id)
        busy = sorted(run for run, instances in runs.items()
                      if (instances.get(processor) or {}).get("state") in UNDER_WAY)
        if not busy:
            return runs
        if time.monotonic() > deadline:
            raise AirflowError(f"{processor}: still under way in {', '.join(busy)} after {wait:.0f}s; once it ends, "
                               f"run the catch-up again (it resumes the standby)")
        if not said:
            progress(f"  waiting for {processor} to end in {', '.join(busy)} (started before its standby)")
            said = True
        time.sleep(1.0)


UNDER_WAY = ("queued", "running", "up_for_retry", "restarting", "deferred", "up_for_reschedule")


def _clear_after(dag_id: str, client: Any, runs: dict[str, dict[str, dict[str, Any]]], epochs: dict[str, int],
                 task: str, partition: int, replica: str, epoch: int) -> list[int]:
    """Clear the standby's task instances of the epochs after ``epoch`` that its dead
    predecessor left skipped or failed: Airflow runs them on the spare, in epoch order. (One
    done already, on a resumed catch-up, is left alone.)"""

    processor = ReplicaId(task=task, partition=partition, replica=replica).processor
    cleared = []
    for run, instances in sorted(runs.items(), key=lambda item: epochs.get(item[0], 0)):
        ti = instances.get(processor)
        e = epochs.get(run)
        if ti is None or e is None or e <= epoch or ti.get("state") not in LEFT_BY_THE_DEAD:
            continue
        client.clear(dag_id, run, [processor])
        cleared.append(e)
    return cleared


LEFT_BY_THE_DEAD = ("skipped", "failed", "upstream_failed")


def _run_epochs(dag_id: str, client: Any, runs: dict[str, dict[str, dict[str, Any]]], snapshot: Any) -> dict[str, int]:
    """The epoch of each DAG run: from the ledger's rows, else from the logical date its task
    instances carry, on the DAG's epoch clock (a run that has committed nothing yet)."""
    from datetime import datetime

    from falkirk.plugins.dag_facts import regimes_and_clock
    from falkirk.policies.epochs import EpochError

    epochs = {e.run_id: e.epoch for e in snapshot.entries()}
    unknown = [run for run in runs if run not in epochs]
    clock = regimes_and_clock(dag_id, client)[1] if unknown else None
    for run in unknown if clock is not None else ():
        logical = next((ti.get("logical_date") for ti in runs[run].values() if ti.get("logical_date")), None)
        try:
            if logical and clock is not None:
                epochs[run] = clock.epoch_of(datetime.fromisoformat(logical))
        except EpochError:
            pass  # not on the epoch grid (an `airflow dags test` run): not the standby's
    return epochs



def layout_table(layout: Any, snapshot: Any | None = None) -> str:
    """The layout as ``falkirk pairs`` prints it: one line per replica, with its latest epoch."""

    lines = [f"{'replica':<22} {'worker':<14} {'status':<7} {'gen':>3}  latest epoch"]
    for r in layout.replicas:
        latest = "-"
        if snapshot is not None:
            epochs = [e.epoch for e in snapshot.entries()
                      if e.task_id == r.task and e.map_index == r.id.map_index]
            latest = str(max(epochs)) if epochs else "-"
        lines.append(f"{r.name:<22} {r.worker:<14} {r.status.value:<7} {r.generation:>3}  {latest}")
    lost = layout.lost_partitions()
    if lost:
        lines.append("lost (no active replica; restore on the durable path): "
                     + ", ".join(ReplicaId.partition_name(t, p) for t, p in lost))
    return "\n".join(lines)


__all__ = ["CatchUp", "TakeOver", "catch_up", "dag_policy", "layout_table", "take_over"]
