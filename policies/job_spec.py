"""The command-line contract between the Airflow operator and the job runtime.

The operator renders a :class:`JobSpec` as ``spark-submit`` application arguments; the
runtime parses them back. Keeping both directions here means the two sides cannot drift.

>>> from falkirk.policies.regimes import EagerCheckpoint
>>> spec = JobSpec(dag_id="orders", task_id="aggregate", epoch=2, regime=EagerCheckpoint(), run_id="epoch-2", inputs=("ingest",),
...                products=("output",))
>>> JobSpec.parse(spec.argv()) == spec
True
>>> part = JobSpec(dag_id="clicks", task_id="tally", epoch=2, regime=EagerCheckpoint(), run_id="epoch-2", map_index=1, partitions=4,
...                inputs=("events",), input_partitions=(("events", 2),))
>>> JobSpec.parse(part.argv()) == part
True
>>> JobSpec.parse(JobSpec(dag_id="s", task_id="draw", epoch=1, regime=EagerCheckpoint(), run_id="epoch-1", deterministic=False).argv()).deterministic
False
>>> JobSpec.parse(JobSpec(dag_id="s", task_id="draw", epoch=1, regime=EagerCheckpoint(), run_id="epoch-1", task_instance=True).argv()).task_instance
True
>>> pair = JobSpec(dag_id="f", task_id="stats", epoch=1, regime=EagerCheckpoint(), run_id="epoch-1", map_index=3, partitions=2, replicas=2,
...                inputs=("sessions",), input_partitions=(("sessions", 2),), paired_inputs=("sessions",))
>>> JobSpec.parse(pair.argv()) == pair, pair.processor, str(pair.replica)
(True, 'stats[3]', 'stats[1].B')
>>> from falkirk.policies.asset_events import CommittedEpoch, ConsumedEvent
>>> fed = JobSpec(dag_id="reports", task_id="report", epoch=3, regime=EagerCheckpoint(), run_id="partition-3",
...               consumed=(ConsumedEvent("orders.ranking", CommittedEpoch(dag_id="orders", task_id="publish", epoch=3, incarnation=1)),))
>>> JobSpec.parse(fed.argv()) == fed
True
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass

from falkirk.policies.asset_events import AssetEventError, ConsumedEvent
from falkirk.policies.ids import OfCommit, ReplicaId
from falkirk.policies.regimes import Regime, RegimeError

# The exit code of a job that refused to re-run an epoch whose Airflow task instance completed
# (the operator fails the task instance without retries); the refusal is the job's last line,
# after REFUSAL_PREFIX.
REFUSED_EXIT_CODE = 3
# The exit code of a replica of a paired task that its twin took over (declared dead before it
# started, or while it ran: its commit fenced); the operator marks the task instance skipped.
TAKEN_OVER_EXIT_CODE = 4
REFUSAL_PREFIX = "[falkirk] refused: "


def first_try(try_number: int, max_tries: int | None, retries: int | None) -> int | None:
    """The first attempt since Airflow created or last cleared a task instance: Airflow sets
    ``max_tries`` to the task's ``retries`` as it creates the instance and to ``try_number +
    retries`` as it clears it, so the first is ``max_tries - retries + 1`` (Airflow's own
    ``first_try_number``); ``None`` when either is unknown or the result does not fit ``try_number``.

    >>> first_try(1, 0, 0), first_try(2, 0, 0), first_try(2, 1, 0), first_try(2, 1, 1), first_try(3, 5, 1)
    (1, 1, 2, 1, None)
    """
    if max_tries is None or retries is None:
        return None
    first = max_tries - retries + 1
    return first if 1 <= first <= try_number else None


def completed_epoch_refusal(spec: JobSpec, run_id: str, try_number: int, plan_size: str = "") -> str:
    """Why a re-run of a completed epoch is refused, and the plan that redoes it (with its size,
    ``plan_size``, where known): a few short lines, so that Airflow's log viewer shows the
    commands without scrolling.

    >>> from falkirk.policies.regimes import EagerCheckpoint
    >>> print(completed_epoch_refusal(JobSpec(dag_id="d", task_id="agg", epoch=2, regime=EagerCheckpoint(), run_id="epoch-2"), "epoch-2", 1))
    agg epoch 2 already completed (committed by run epoch-2, try 1) and no recovery has rolled it back:
    running it again would change nothing, neither its result nor any result built on it.
    To redo the epoch (after correcting its input, say), plan a recovery and replay it
    (or preview and replay it in the Falkirk view):
        falkirk plan --dag d --bad-epoch agg:2
        falkirk replay PLAN_ID
    To keep the results as they are (this run's refused instances, then the run, marked success):
        falkirk keep --dag d --run epoch-2 --yes
    """
    return "\n".join([
        f"{spec.processor} epoch {spec.epoch} already completed (committed by run {run_id}, try {try_number}) and "
        f"no recovery has rolled it back:",
        "running it again would change nothing, neither its result nor any result built on it.",
        "To redo the epoch (after correcting its input, say), plan a recovery and replay it",
        "(or preview and replay it in the Falkirk view):",
        f"    falkirk plan --dag {spec.dag_id} --bad-epoch {spec.processor}:{spec.epoch}{plan_size}",
        "    falkirk replay PLAN_ID",
        "To keep the results as they are (this run's refused instances, then the run, marked success):",
        f"    falkirk keep --dag {spec.dag_id} --run {spec.run_id} --yes",
    ])


def previous_epoch_refusal(dag_id: str, processor: str, epoch: int, rolled_back: bool, kept: int | None) -> str:
    """Why a stateful task's ``epoch`` does not start when the epoch before it has no checkpoint:
    ``rolled_back`` by a recovery not finished, or never committed (its newest checkpoint before
    is ``kept``). Airflow's ``depends_on_past`` lets an epoch run when the one before has no DAG
    run at all, as after a run made at a date far ahead: the message names the discard too.

    >>> print(previous_epoch_refusal("orders", "aggregate", 329, False, 14))
    aggregate epoch 329: the previous epoch 328 has no checkpoint (its task instance failed or never ran). Not restoring an older checkpoint across the gap. Once epoch 328 is redone this epoch can run: a running recovery clears it when it finishes; otherwise plan one with falkirk plan --dag orders --failed-task aggregate:328. If epochs 15..328 have no DAG run (this run's date was far ahead by mistake), withdraw this run and the ones after it instead (it previews; add --yes): falkirk discard --dag orders --epochs 329-
    """
    why = ("was rolled back by a recovery and has not been redone yet" if rolled_back
           else "has no checkpoint (its task instance failed or never ran)")
    ahead = "" if rolled_back or kept is None else (
        f" If epochs {kept + 1}..{epoch - 1} have no DAG run (this run's date was far ahead by mistake), withdraw "
        f"this run and the ones after it instead (it previews; add --yes): falkirk discard --dag {dag_id} --epochs "
        f"{epoch}-")
    return (f"{processor} epoch {epoch}: the previous epoch {epoch - 1} {why}. Not restoring an older checkpoint "
            f"across the gap. Once epoch {epoch - 1} is redone this epoch can run: a running recovery clears it when "
            f"it finishes; otherwise plan one with falkirk plan --dag {dag_id} --failed-task {processor}:{epoch - 1}."
            f"{ahead}")


def replaced_input_refusal(spec: JobSpec, producer: str, epoch: int, read: int, now: int,
                           plan_size: str = "") -> str:
    """Why a run Airflow started on a replacement asset event is refused: the epoch completed
    having read ``producer``'s ``epoch`` as incarnation ``read``, which a recovery in the
    producer's DAG has replaced by ``now``; the plan that redoes it and the epochs built on it.

    >>> from falkirk.policies.regimes import EagerCheckpoint
    >>> print(replaced_input_refusal(JobSpec(dag_id="leaders", task_id="leaders", epoch=3, regime=EagerCheckpoint(), run_id="asset_triggered__x"),
    ...                              "falkirk_orders.publish", 3, 0, 1))
    leaders epoch 3 read falkirk_orders.publish epoch 3 as incarnation 0, which a recovery there has replaced
    (incarnation 1): this epoch, and every later one built on it, is stale. Airflow started this run on the
    replacement's asset event, but a re-run of one task instance cannot redo what was built on it.
    Plan the recovery that redoes them, and replay it (or preview and replay it in the Falkirk view):
        falkirk plan --dag leaders --bad-epoch leaders:3
        falkirk replay PLAN_ID
    """
    return "\n".join([
        f"{spec.processor} epoch {spec.epoch} read {producer} epoch {epoch} as incarnation {read}, which a recovery "
        f"there has replaced",
        f"(incarnation {now}): this epoch, and every later one built on it, is stale. Airflow started this run on the",
        "replacement's asset event, but a re-run of one task instance cannot redo what was built on it.",
        "Plan the recovery that redoes them, and replay it (or preview and replay it in the Falkirk view):",
        f"    falkirk plan --dag {spec.dag_id} --bad-epoch {spec.processor}:{spec.epoch}{plan_size}",
        "    falkirk replay PLAN_ID",
    ])


@dataclass(frozen=True, kw_only=True)
class JobSpec(OfCommit):
    """What the operator tells a job: which task, which epoch, under which regime, reading what."""

    dag_id: str
    task_id: str
    epoch: int
    regime: Regime
    run_id: str
    try_number: int = 1
    # The first attempt since Airflow created or last cleared the task instance (Airflow's own
    # ``max_tries - retries + 1``); None: this one. See :meth:`retries_attempt`.
    first_try: int | None = None
    map_index: int = -1
    incarnation: int = 0
    inputs: tuple[str, ...] = ()
    # Outputs the team keeps as products: garbage collection never deletes them.
    products: tuple[str, ...] = ()
    # A partitioned task's partition count (its partition is map_index); None: not partitioned.
    partitions: int | None = None
    # (input task, its partition count) for each partitioned input.
    input_partitions: tuple[tuple[str, int], ...] = ()
    # False: a re-run may compute other results (sampling, wall clock, an external call), so
    # its determinants are saved durably before a sink commits anything derived from them.
    deterministic: bool = True
    # True: this run is an Airflow task instance. The job then refuses a re-run of an epoch whose
    # task instance completed (exit code REFUSED_EXIT_CODE) and records its own completion.
    task_instance: bool = False
    # Replicas per partition (2: process pairs; map_index is then 2 * partition + replica).
    replicas: int = 1
    # The partitioned inputs run as process pairs: each partition is read from one of its replicas.
    paired_inputs: tuple[str, ...] = ()
    # The commits of other DAGs' tasks this run consumed through Airflow Assets (its triggering
    # asset events that a Falkirk task emitted).
    consumed: tuple[ConsumedEvent, ...] = ()


    @property
    def replica(self) -> ReplicaId | None:
        """The replica (``task[p].R``) of a paired task's instance (``None`` otherwise), as logs name it."""
        return ReplicaId.of(task=self.task_id, map_index=self.map_index) if self.replicas > 1 else None

    def retries_attempt(self, try_number: int) -> bool:
        """Whether this attempt is Airflow's retry of attempt ``try_number`` of the same run: an
        earlier attempt since the task instance was created or last cleared. Airflow retries after
        a failed attempt, and also after it reset an instance it took for orphaned (its scheduler
        missed its heartbeats), which leaves ``max_tries`` as it was; a Clear starts again.

        >>> import dataclasses
        >>> from falkirk.policies.regimes import Batch
        >>> spec = JobSpec(dag_id="d", task_id="t", epoch=2, regime=Batch(), run_id="r", try_number=2, first_try=1)
        >>> spec.retries_attempt(1), dataclasses.replace(spec, first_try=2).retries_attempt(1)
        (True, False)
        >>> dataclasses.replace(spec, first_try=None).retries_attempt(1)  # no first try given: none is retried
        False
        """
        first = self.try_number if self.first_try is None else self.first_try
        return first <= try_number < self.try_number

    @classmethod
    def parse(cls, argv: Sequence[str] | None = None) -> JobSpec:
        parser = argparse.ArgumentParser(description="Run one epoch of a Falkirk task.")
        parser.add_argument("--dag-id", required=True)
        parser.add_argument("--task-id", required=True)
        parser.add_argument("--epoch", required=True, type=int)
        parser.add_argument("--regime", required=True, help="e.g. eager_checkpoint, batch(log_outputs=true)")
        parser.add_argument("--run-id", required=True)
        parser.add_argument("--try-number", type=int, default=1)
        parser.add_argument("--first-try", type=int, default=None,
                            help="the first attempt since the task instance was created or cleared (default: --try-number)")
        parser.add_argument("--map-index", type=int, default=-1)
        parser.add_argument("--incarnation", type=int, default=0)
        parser.add_argument("--input", action="append", default=[], dest="inputs",
                            help="an upstream task whose output this job reads (repeatable)")
        parser.add_argument("--product", action="append", default=[], dest="products",
                            help="an output kept as a product, never garbage-collected (repeatable)")
        parser.add_argument("--partitions", type=int, default=None,
                            help="the task's partition count; its partition is --map-index")
        parser.add_argument("--input-partitions", action="append", default=[], dest="input_partitions",
                            metavar="TASK=N", help="a partitioned input and its partition count (repeatable)")
        parser.add_argument("--nondeterministic", action="store_true",
                            help="a re-run may compute other results: save the determinants durably")
        parser.add_argument("--task-instance", action="store_true",
                            help="run as an Airflow task instance: refuse a re-run of a completed epoch")
        parser.add_argument("--replicas", type=int, default=1, choices=(1, 2),
                            help="replicas per partition (2: process pairs)")
        parser.add_argument("--paired-input", action="append", default=[], dest="paired_inputs",
                            help="a partitioned input run as process pairs (repeatable)")
        parser.add_argument("--consumed", action="append", default=[], metavar="JSON",
                            help="a commit of another DAG's task this run consumed through an Asset: "
                                 "{\"asset\": NAME, \"dag_id\", \"task_id\", \"epoch\", ...} (repeatable)")
        ns = parser.parse_args(argv)
        consumed = []
        for item in ns.consumed:
            try:
                consumed.append(ConsumedEvent.from_json(json.loads(item)))
            except (ValueError, AssetEventError) as exc:  # json's errors are ValueErrors
                parser.error(f"--consumed {item!r}: {exc}")
        counts = []
        for item in ns.input_partitions:
            task, _, n = item.partition("=")
            if not task or not n.isdigit() or int(n) < 1:
                parser.error(f"--input-partitions {item!r}: write TASK=N, N the input's partition count")
            counts.append((task, int(n)))
        instances = (ns.partitions or 0) * ns.replicas
        if ns.partitions is not None and not 0 <= ns.map_index < instances:
            parser.error(f"--map-index {ns.map_index}: a task of {ns.partitions} partitions and {ns.replicas} "
                         f"replica(s) runs 0..{instances - 1}")
        try:
            regime = Regime.parse(ns.regime)
        except RegimeError as exc:
            parser.error(f"--regime: {exc}")
        return cls(dag_id=ns.dag_id, task_id=ns.task_id, epoch=ns.epoch, regime=regime, run_id=ns.run_id,
                   try_number=ns.try_number, first_try=ns.first_try,
                   map_index=ns.map_index, incarnation=ns.incarnation,
                   inputs=tuple(ns.inputs), products=tuple(ns.products), partitions=ns.partitions,
                   input_partitions=tuple(counts), deterministic=not ns.nondeterministic, task_instance=ns.task_instance,
                   replicas=ns.replicas, paired_inputs=tuple(ns.paired_inputs), consumed=tuple(consumed))

    def argv(self) -> list[str]:
        """The command line that :meth:`parse` reads back."""
        out = ["--dag-id", self.dag_id, "--task-id", self.task_id, "--epoch", str(self.epoch),
               "--regime", self.regime.spec(), "--run-id", self.run_id, "--try-number", str(self.try_number),
               "--map-index", str(self.map_index), "--incarnation", str(self.incarnation)]
        if self.first_try is not None:
            out += ["--first-try", str(self.first_try)]
        for name in self.inputs:
            out += ["--input", name]
        for name in self.products:
            out += ["--product", name]
        if self.partitions is not None:
            out += ["--partitions", str(self.partitions)]
        for name, count in self.input_partitions:
            out += ["--input-partitions", f"{name}={count}"]
        if not self.deterministic:
            out.append("--nondeterministic")
        if self.task_instance:
            out.append("--task-instance")
        if self.replicas != 1:
            out += ["--replicas", str(self.replicas)]
        for name in self.paired_inputs:
            out += ["--paired-input", name]
        for event in self.consumed:
            out += ["--consumed", json.dumps(event.to_json(), sort_keys=True)]
        return out
