"""The DAGs a soak keeps running side by side, each compared with a failure-free copy of itself.

Together they use every regime the project has on one shape:

============== ===================================================================================
DAG             what it brings to the soak
============== ===================================================================================
falkirk_figure1 the four Falkirk regimes, an exactly-once SQL sink, a source that can deliver a
                batch again (``bad-input``)
falkirk_shards  partitions: a repartitioning edge, each partition's state recovered on its own;
                opted in to self-healing (``falkirk watch`` replays a lost worker's plan)
falkirk_loops   checkpoints inside an epoch: PageRank steps and chunks, resumed mid-epoch
falkirk_regions sender-side logs: state in scratch only, rebuilt from the producers' logs;
                opted in to self-healing
falkirk_sampled marker pairs: a non-deterministic producer streaming to an exactly-once sink
                inside the epoch, its draws logged as they go
falkirk_pairs   process pairs: every partition run twice, on both workers; ``falkirk watch`` takes
                a lost worker's replicas over, then the user catches them up on its replacement
falkirk_orders  two DAGs joined by an Airflow Asset: each committed epoch of ``publish`` starts
                the run of ``falkirk_orders_leaders`` that reads it; a recovery in orders is
                planned with its consumers (``falkirk plan --consumers``), replayed across both
============== ===================================================================================

Every DAG's input but ``falkirk_sampled``'s is a function of the epoch alone, so a failure-free
run of the same epochs (:mod:`devstack.inprocess`, under :attr:`SoakDag.reference`) must commit
the same rows. ``falkirk_sampled`` draws other rows on every run (``compared=False``): the soak
checks instead that its sink holds exactly what its producer logged, once.

>>> [d.dag_id for d in dags_named("figure1,shards")]
['falkirk_figure1', 'falkirk_shards']
>>> dags_named("figure1,teapot")
Traceback (most recent call last):
...
ValueError: --dags: unknown DAG 'teapot'; the soak runs figure1, shards, loops, regions, sampled, pairs, orders, orders_leaders (any of them, figure1 first)
>>> dags_named("figure1,orders_leaders")
Traceback (most recent call last):
...
ValueError: --dags: orders_leaders runs on what orders publishes: name orders before it
>>> SOAK_DAGS["shards"].processors()
('events[0]', 'events[1]', 'totals[0]', 'totals[1]', 'totals[2]', 'totals[3]', 'leaders[0]', 'leaders[1]', 'leaders[2]', 'leaders[3]', 'report')
>>> SOAK_DAGS["pairs"].paired, SOAK_DAGS["pairs"].processors()[:4]  # replicas A and B of each partition
(True, ('ingress', 'sessions[0]', 'sessions[1]', 'sessions[2]'))
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import ModuleType

from devstack.airflow import PROJECT_ROOT
from falkirk.policies.ids import ProcessorId

DAGS_ENV = "FALKIRK_SOAK_DAGS"  # the DAG ids the soak's DAG file builds, comma-separated
AUTO_RECOVER_ENV = "FALKIRK_SOAK_AUTO_RECOVER"  # ... and those of them it tags falkirk:auto_recover
REGIONS_END = 100_000  # falkirk_regions' execution ends far past any soak: its at_end logs are kept throughout


@dataclass(frozen=True)
class Feed:
    """The Airflow Asset a DAG is scheduled on, and the task of another soak DAG that updates it:
    each committed epoch of ``task`` starts the consumer's run of that epoch."""

    asset: str
    producer: str  # the producer's short name in :data:`SOAK_DAGS`
    task: str


@dataclass(frozen=True)
class SoakDag:
    """One DAG of the soak: its file under ``dags/`` (its ``dag``, ``REGIMES``, ``EDGES`` and
    ``PARTITIONS``), its jobs' package, and the environment both its copies are made in."""

    name: str
    package: str
    env: Mapping[str, str] = field(default_factory=dict)
    crash_steps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # a task's points inside an epoch
    compared: bool = True  # its rows are a function of its epochs: compared with a failure-free copy
    # Tables that carry rows between two tasks inside an epoch (``task/table``, on any worker's
    # disk): named by no ledger row, emptied as each epoch is delivered.
    channels: tuple[str, ...] = ()
    # Opted in to replays without a person (the tag falkirk:auto_recover): the soak's
    # ``falkirk watch`` plans and replays the recovery for a lost worker; a user only plans
    # what fails otherwise.
    auto_recover: bool = False
    # Scheduled on an Asset another soak DAG updates: Airflow starts its runs, not the soak; its
    # epochs are its producer's.
    fed: Feed | None = None

    @property
    def dag_id(self) -> str:
        return f"falkirk_{self.name}"

    @property
    def reference(self) -> str:
        """The failure-free copy's DAG id (its tables beside the soak's, in the same store)."""
        return f"{self.dag_id}_reference"

    @property
    def dag_file(self) -> Path:
        return PROJECT_ROOT / "dags" / f"{self.dag_id}.py"

    @cached_property
    def module(self) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"soak_{self.dag_id}", self.dag_file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(getattr(self.module, "REGIMES", None) or self.module.dag.task_ids)

    @property
    def paired(self) -> bool:
        """Whether a task of it runs under process pairs (its replicas caught up after a loss)."""
        return any(r.replicas > 1 for r in getattr(self.module, "REGIMES", {}).values())

    def processors(self) -> tuple[str, ...]:
        """Every task instance of one epoch, as the planner and crash points name them (each
        replica of a paired task's partitions too)."""
        partitions = getattr(self.module, "PARTITIONS", {})
        regimes = getattr(self.module, "REGIMES", {})
        return tuple(ProcessorId(task=t, map_index=i) for t in self.tasks
                     for i in (range(partitions[t] * regimes[t].replicas) if t in partitions else (-1,)))


SOAK_DAGS: Mapping[str, SoakDag] = {d.name: d for d in (
    SoakDag("figure1", "falkirk.spark_jobs.figure1"),
    SoakDag("shards", "falkirk.spark_jobs.shards", auto_recover=True),
    SoakDag("loops", "falkirk.spark_jobs.loops", crash_steps={"rank": ("iteration-23",), "tally": ("chunk-4",)}),
    SoakDag("regions", "falkirk.spark_jobs.regions", env={"FALKIRK_REGIONS_END": str(REGIONS_END)},
            auto_recover=True),
    SoakDag("sampled", "falkirk.spark_jobs.sampled", crash_steps={"draw": ("chunk-3", "chunk-3-after-files")},
            compared=False, channels=("draw/edge", "draw/edge-control")),
    SoakDag("pairs", "falkirk.spark_jobs.sessions"),
    SoakDag("orders", "falkirk.spark_jobs.pipeline"),
    SoakDag("orders_leaders", "falkirk.spark_jobs.pipeline", fed=Feed("falkirk_orders.ranking", "orders", "publish")),
)}
"""Every DAG a soak can run, by short name; ``figure1`` is the one the input faults target."""


def dags_named(names: str) -> list[SoakDag]:
    """The DAGs ``--dags`` names (comma-separated short names), refusing an unknown one."""
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    for name in chosen:
        if name not in SOAK_DAGS:
            raise ValueError(f"--dags: unknown DAG {name!r}; the soak runs {', '.join(SOAK_DAGS)} "
                             f"(any of them, figure1 first)")
    if not chosen or chosen[0] != "figure1" or len(set(chosen)) != len(chosen):
        raise ValueError(f"--dags {names!r}: name figure1 first, then any of {', '.join(list(SOAK_DAGS)[1:])}, "
                         f"each once")
    for n, name in enumerate(chosen):
        fed = SOAK_DAGS[name].fed
        if fed is not None and fed.producer not in chosen[:n]:
            raise ValueError(f"--dags: {name} runs on what {fed.producer} publishes: name {fed.producer} before it")
    return [SOAK_DAGS[n] for n in chosen]
