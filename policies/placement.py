"""Placement: which worker a task instance must run on, so that it finds its scratch data.

The scratch tier is a worker's local disk. A task that restores its state from scratch
(``LazyCheckpoint``) must run where that state is, and a task that reads an upstream
output kept only in scratch (``Ephemeral``, ``Batch`` without logging) must run where the
upstream ran. So the tasks of a DAG that exchange scratch data form **scratch groups**
(connected through scratch state and scratch edges), and each group has a **home**: the
worker every one of its task instances runs on. This is allocation-preserving scheduling,
as Flink's task-local recovery does it: the next epoch asks for the previous epoch's
slot.

A group's home is the worker of its latest checkpoint kept in scratch, unless that worker
was lost (a recovery with ``--lost-worker`` was carried out) and has committed nothing
since. A producer that a member reads while both run (its ``concurrent_inputs``) keeps the
channel between them on its worker's disk, so its latest commit places the group too, even
with no table in scratch: the reader of that epoch must find the channel there. A group with
no such checkpoint (its first epoch, or after its worker was lost)
runs on the queue the DAG gives the task when that queue is one of ``workers``, else on a
worker chosen by rendezvous hashing, so every task instance of the group computes the
same home without talking to the others. Live workers are chosen before lost ones; when
every worker was lost, the choice is among them all (a lost worker's name is a machine
with an empty disk, as good as any other), so a group still has one home. The Airflow side
(:mod:`falkirk.plugins.placement`) sets the task instance's queue to the home's.

A group of partitioned tasks with one partition count (``totals`` and the ``leaders`` that
read its scratch outputs one-to-one, say) is placed partition by partition: partition ``i``
of each of its tasks runs where partition ``i``'s scratch checkpoint is, and partitions with
none are spread round-robin over the live workers, partition 0 on the queue the DAG gives
(:func:`partitioned_group`). A group that mixes partitioned and other tasks has one home.

>>> from falkirk.policies.regimes import Batch, EagerCheckpoint, Ephemeral, LazyCheckpoint
>>> dag = {"ingest": (Ephemeral(), ()), "aggregate": (LazyCheckpoint(every=3), ("ingest",)),
...        "publish": (EagerCheckpoint(), ("aggregate",)), "report": (Batch(log_outputs=True), ())}
>>> [sorted(g) for g in scratch_groups(dag)]  # aggregate keeps its outputs in scratch too
[['aggregate', 'ingest', 'publish']]
>>> from falkirk.policies.store.ledger import LedgerEntry
>>> row = LedgerEntry(dag_id="orders", task_id="aggregate", epoch=4, regime="lazy_checkpoint(every=3)", run_id="r4", try_number=1,
...                   state_uri="/s/worker-b/orders/aggregate/state", state_tier="scratch", worker="worker-b")
>>> home_worker("orders", scratch_groups(dag)[0], [row], workers=("worker-a", "worker-b"))
'worker-b'
>>> home_worker("orders", scratch_groups(dag)[0], [row], workers=("worker-a", "worker-b"),
...             lost={"worker-b": row.committed_at})
'worker-a'
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime

from falkirk.policies.regimes import Regime, Tier
from falkirk.policies.store.ledger import LedgerEntry
from falkirk.policies.workers import WORKERS_ENV, configured_workers  # noqa: F401 - part of this module's API


def keeps_scratch_state(regime: Regime) -> bool:
    """Whether ``regime`` restores state from scratch (at some epoch)."""
    return regime.keeps_state and Tier.SCRATCH in regime.state_tiers(1)


def writes_scratch_outputs(regime: Regime) -> bool:
    """Whether ``regime`` keeps its outputs in scratch, where only its worker can read them."""
    return regime.output_tier(1) is Tier.SCRATCH


def scratch_groups(tasks: Mapping[str, tuple[Regime | None, Sequence[str]]],
                   concurrent: Mapping[str, Sequence[str]] | None = None) -> list[frozenset[str]]:
    """The DAG's scratch groups, from each task's regime (``None``: not managed) and upstream
    tasks, and the tasks each reads while they run (``concurrent``: its ``concurrent_inputs``).

    A task joins its upstream's group when the upstream keeps its outputs in scratch; a task
    restoring state from scratch is in a group even alone. A task and its concurrent inputs are
    always in one group: their rows pass between them inside the epoch, through a channel the
    producer keeps beside its tables (a marker edge in its scratch, say), which both must reach.
    Tasks in no group may run anywhere.

    >>> from falkirk.policies.regimes import Batch, LazyCheckpoint
    >>> sampled = {"draw": (Batch(log_outputs=True), ()), "deliver": (LazyCheckpoint(every=2), ())}
    >>> [sorted(g) for g in scratch_groups(sampled)], [sorted(g) for g in scratch_groups(sampled, {"deliver": ["draw"]})]
    ([['deliver']], [['deliver', 'draw']])
    """
    parent = {t: t for t in tasks}

    def find(t: str) -> str:
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    member: set[str] = set()
    for task, (regime, upstream) in tasks.items():
        if regime is not None and keeps_scratch_state(regime):
            member.add(task)
        for up in upstream:
            up_regime = tasks.get(up, (None, ()))[0]
            if up_regime is not None and writes_scratch_outputs(up_regime):
                member |= {task, up}
                parent[find(task)] = find(up)
        for up in (concurrent or {}).get(task, ()):
            if up in tasks and regime is not None and tasks[up][0] is not None:
                member |= {task, up}
                parent[find(task)] = find(up)
    groups: dict[str, set[str]] = {}
    for task in member:
        groups.setdefault(find(task), set()).add(task)
    return sorted((frozenset(g) for g in groups.values()), key=sorted)


def group_of(task_id: str, groups: Iterable[frozenset[str]]) -> frozenset[str] | None:
    """The scratch group ``task_id`` belongs to, if any."""
    return next((g for g in groups if task_id in g), None)


def partitioned_group(group: frozenset[str], partitions: Mapping[str, int | None]) -> bool:
    """Whether ``group`` is placed partition by partition: all its tasks have one partition count.

    >>> partitioned_group(frozenset({"totals", "leaders"}), {"totals": 4, "leaders": 4})
    True
    >>> partitioned_group(frozenset({"events", "totals"}), {"totals": 4})
    False
    """
    counts = {partitions.get(t) for t in group}
    return len(counts) == 1 and None not in counts


def home_worker(dag_id: str, group: frozenset[str], rows: Iterable[LedgerEntry], workers: Sequence[str],
                lost: Mapping[str, datetime] | None = None, preferred: str | None = None,
                partition: int | None = None, channels: Collection[str] = ()) -> str | None:
    """The worker ``group``'s task instances run on (see the module docstring); ``None`` when
    there is no checkpoint to follow and no ``workers`` to choose from. Only ``workers`` are
    chosen: a checkpoint on a worker not among them is not followed. ``preferred``: the queue
    the DAG gives the task, taken when no checkpoint decides. ``partition``: the partition
    whose instances are placed, in a group placed partition by partition. ``channels``: the
    group's tasks that keep a channel on their worker's disk (the concurrent inputs of its
    other tasks): any committed row of theirs places the group.

    >>> rows = [LedgerEntry(dag_id="d", task_id="totals", epoch=1, regime="lazy_checkpoint(every=4)", run_id="r1", try_number=1, map_index=1,
    ...                     state_uri="/s/worker-a/d/totals/partition-1/state", state_tier="scratch",
    ...                     worker="worker-a")]
    >>> [home_worker("d", frozenset({"totals"}), rows, ("worker-a", "worker-b"), partition=p) for p in range(4)]
    ['worker-a', 'worker-a', 'worker-a', 'worker-b']

    A producer that committed its epoch on worker-b after worker-b was recorded lost left that
    epoch's channel there: its reader follows it, though the producer keeps no scratch table.

    >>> from datetime import timedelta
    >>> at = rows[0].committed_at
    >>> drew = LedgerEntry(dag_id="d", task_id="draw", epoch=2, regime="batch(log_outputs=true)", run_id="r2", try_number=1, worker="worker-b",
    ...                    committed_at=at + timedelta(minutes=5))
    >>> sampled = frozenset({"draw", "deliver"})
    >>> home_worker("d", sampled, [drew], ("worker-a", "worker-b"), lost={"worker-b": at}, channels={"draw"})
    'worker-b'
    >>> home_worker("d", sampled, [drew], ("worker-a", "worker-b"), lost={"worker-b": at})
    'worker-a'
    """
    lost = lost or {}

    def usable(row: LedgerEntry) -> bool:  # a worker placement knows, that has not been lost since
        gone = lost.get(row.worker or "")
        return row.worker in workers and (gone is None or row.committed_at > gone)

    held = [r for r in rows if r.dag_id == dag_id and r.task_id in group
            and (r.scratch_uris() or r.task_id in channels) and usable(r)
            and (partition is None or r.map_index == partition)]
    if held:
        return max(held, key=lambda r: (r.epoch, r.committed_at)).worker
    # every worker lost (both of two, say): their names are fresh disks now, and the group must
    # still have one home, or its instances keep whatever queues earlier placements gave them
    alive = [w for w in workers if w not in lost] or list(workers)
    if partition is not None and alive:  # spread round-robin, partition 0 on the preferred queue
        start = alive.index(preferred) if preferred in alive else 0
        return alive[(start + partition) % len(alive)]
    if preferred in alive:
        return preferred
    if not alive:
        return None
    key = json.dumps([dag_id, sorted(group)])
    return max(alive, key=lambda w: hashlib.sha256(f"{key}/{w}".encode()).hexdigest())


def lost_workers(events: Iterable[Mapping], plans: Mapping[str, Mapping]) -> dict[str, datetime]:
    """Per worker named by a carried-out recovery (``--lost-worker``), when that recovery started.

    ``events`` are recovery-log rows; ``plans`` the recorded plans' JSON by plan id.

    >>> from datetime import datetime, timezone
    >>> at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> plans = {"p1": {"failures": [{"kind": "lost_worker", "worker": "worker-a"}]}}
    >>> lost_workers([{"plan_id": "p1", "event": "started", "recorded_at": at}], plans)
    {'worker-a': datetime.datetime(2026, 1, 1, 0, 0, tzinfo=datetime.timezone.utc)}
    >>> lost_workers([{"plan_id": "p1", "event": "planned", "recorded_at": at}], plans)
    {}
    """
    lost: dict[str, datetime] = {}
    for e in events:
        if e["event"] not in ("started", "resumed") or e["plan_id"] not in plans:
            continue
        for f in plans[e["plan_id"]].get("failures", ()):
            if f.get("kind") == "lost_worker":
                lost[f["worker"]] = max(lost.get(f["worker"], e["recorded_at"]), e["recorded_at"])
    return lost


