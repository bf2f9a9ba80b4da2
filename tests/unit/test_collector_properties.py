"""Garbage collection never takes what a recovery needs (property test, no Spark).

A six-task pipeline runs random sequences of epochs, garbage collections and acceptances
by the external system its ``export`` task sends to, over a model of the store (which
epochs each table still holds). Collections acknowledge the source's input through its
low-watermark. Then something fails: the whole scratch tier is lost, or a task instance
fails in a new epoch. The recovery the solver plans must still be executable: every
state it restores is still there, every input epoch a re-run reads (a window included)
is either still stored or re-run itself, the source re-reads no acknowledged epoch, and
every epoch the external system has not accepted is sent again. The low-watermarks never
fall, and a second collection reclaims nothing.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, LazyCheckpoint, SenderLog
from falkirk.policies.planning.chains import DataEdge, TaskGraph
from falkirk.policies.planning.collector import CollectionPlan, plan_collection
from falkirk.policies.planning.recovery import FailedTask, LostScratch, plan_recovery
from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef, external_uri, is_external
from falkirk.policies.store.readability import durable_only

READS_BACK = {("clean", "window"): 2}  # window reads the last three epochs of clean


def pipeline(every: int, end: int = 0):
    regimes = {"source": Ephemeral(), "clean": Batch(log_outputs=True), "model": LazyCheckpoint(every=every),
               "sink": EagerCheckpoint(), "window": Batch(log_outputs=True), "export": Ephemeral(),
               # under sender-side logs: state in scratch only, rebuilt from clean's retained epochs
               "recent": SenderLog(release={"clean": f"window({every})"}),
               "tally": SenderLog(release={"clean": "at_end"}, end=end)}
    edges = [("source", "clean"), ("clean", "model"), ("model", "sink"), ("clean", "window"), ("model", "export"),
             ("clean", "recent"), ("clean", "tally")]
    return regimes, TaskGraph(tuple(regimes), tuple(DataEdge(a, "output", b) for a, b in edges))


class Store:
    """Which epochs every table holds, the ledger, and the collection marks."""

    def __init__(self, every: int, end: int = 0) -> None:
        self.regimes, self.graph = pipeline(every, end)
        self.live: dict[str, set[int]] = {}
        self.rows: list[LedgerEntry] = []
        self.marks: dict[str, int] = {}
        self.epoch = 0
        self.delivered = 0  # the external system has accepted export's epochs <= this
        self.acknowledged = 0  # the source's input is forgotten through this epoch

    def readable(self, uri: str, key) -> bool:
        if is_external(uri):
            return key.epoch <= self.delivered
        if uri.endswith("/state") and key.epoch <= self.marks.get(key.task_id, 0):
            return False
        return key.epoch in self.live.get(uri, set())

    def run_epoch(self, failed: str | None = None) -> None:
        """One DAG run; a failed task and what reads it (and later epochs of stateful ones) get no row."""
        self.epoch += 1
        t = self.epoch
        missing = {failed} if failed else set()
        for task, regime in self.regimes.items():
            ups = [e.src for e in self.graph.edges if e.dst == task]
            if task in missing or any(u in missing for u in ups):
                missing.add(task)
                continue
            tier = regime.output_tier(t).value
            out = f"/{tier}/{task}/output"
            self.live.setdefault(out, set()).add(t)
            output = OutputRef("output", out, tier, t, 1)
            if task == "export":
                output = OutputRef("sent", external_uri("outbox"), "external", 0, 1)
            state_uri = None
            for st_tier in regime.state_tiers(t):
                state_uri = f"/{st_tier.value}/{task}/state"
                self.live.setdefault(state_uri, set()).add(t)
            self.rows.append(LedgerEntry(
                dag_id="d", task_id=task, epoch=t, regime=regime.spec(), run_id=f"epoch-{t}", try_number=1, state_uri=state_uri,
                state_tier=regime.state_tier(t).value if state_uri else None,
                outputs=(output,), notified_through=t,
                inputs=tuple(InputRef(task_id=u, output="output", through=t, reads_back=READS_BACK.get((u, task), 0)) for u in ups)))

    def accept(self) -> None:
        """The external system accepts export's next epoch, if export has sent it."""
        sent = {r.epoch for r in self.rows if r.task_id == "export"}
        if self.delivered + 1 in sent:
            self.delivered += 1

    def plan_gc(self) -> CollectionPlan:
        return plan_collection("d", self.rows, self.graph, durable_only(self.readable, "/scratch"),
                               lambda uri: {e: 1 for e in self.live.get(uri, ())}, self.marks)

    def collect(self) -> CollectionPlan:
        plan = self.plan_gc()
        self.marks.update(plan.marks)
        self.acknowledged = max(self.acknowledged, plan.acknowledged["source"])
        for r in plan.tables:
            self.live[r.uri] -= set(r.epochs)
        return plan


def output_uri(regime, task: str, epoch: int) -> str:
    return f"/{regime.output_tier(epoch).value}/{task}/output"


@settings(max_examples=150, deadline=None)
@given(every=st.integers(2, 4), end=st.integers(0, 12),
       steps=st.lists(st.sampled_from(["epoch", "epoch", "epoch", "gc", "accept"]), min_size=1, max_size=28),
       failure=st.one_of(st.just(None), st.sampled_from(["source", "clean", "model", "sink", "window", "export",
                                                         "recent", "tally"])))
def test_every_planned_recovery_stays_executable_after_collections(every, end, steps, failure) -> None:
    store = Store(every, end)
    watermarks: dict[str, int] = {}
    for step in steps:
        if step == "epoch":
            store.run_epoch()
        elif step == "accept":
            store.accept()
        elif store.rows:
            plan = store.collect()
            for task, w in plan.watermarks.items():
                assert w >= watermarks.get(task, 0), f"{task}'s low-watermark fell"
                watermarks[task] = w
            assert store.plan_gc().empty  # a second collection reclaims nothing
    if not store.rows:
        return

    if failure is None:  # the whole scratch tier is lost
        for uri in store.live:
            if uri.startswith("/scratch/"):
                store.live[uri] = set()
        failures = [LostScratch("/scratch")]
    else:
        store.run_epoch(failed=failure)
        failures = [FailedTask(failure, store.epoch)]
    p = plan_recovery("d", store.graph, store.rows, failures, store.epoch, store.readable)

    rerun = {t.task_id: set(t.rerun) for t in p.tasks}
    assert all(e > store.acknowledged for e in rerun["source"]), "the source re-reads an acknowledged epoch"
    assert p.task("export").kept_through <= store.delivered
    assert set(range(store.delivered + 1, store.epoch + 1)) <= rerun["export"], "an unaccepted epoch is not re-sent"
    for t in p.tasks:
        assert t.kept_through >= watermarks.get(t.task_id, 0), f"{t.task_id} rolls back below its low-watermark"
        regime = store.regimes[t.task_id]
        if t.rerun and regime.keeps_state and t.kept_through > 0:
            assert t.restore_from is not None
            if isinstance(regime, SenderLog) and t.restore_from.epoch not in store.live[t.restore_from.uri]:
                # no state anywhere: the first re-run rebuilds it from the epochs not released by then
                for src, released in regime.released(t.kept_through).items():
                    for e in range(released + 1, t.kept_through + 1):
                        assert e in store.live.get(output_uri(store.regimes[src], src, e), ()), \
                            f"{t.task_id} rebuilds its state of epoch {t.kept_through} but {src}'s epoch {e} is gone"
                continue
            assert t.restore_from.epoch in store.live[t.restore_from.uri], f"{t.task_id}: restored state was collected"
        for edge in (e for e in store.graph.edges if e.dst == t.task_id):
            back = READS_BACK.get((edge.src, edge.dst), 0)
            for e in t.rerun:
                for read in range(max(1, e - back), e + 1):
                    up = store.regimes[edge.src]
                    assert read in rerun[edge.src] or read in store.live.get(output_uri(up, edge.src, read), ()), \
                        f"{t.task_id} re-runs epoch {e} but {edge.src}'s epoch {read} is neither stored nor re-run"


def test_collect_refuses_a_retention_delta_cannot_vacuum_before_reading_anything(tmp_path) -> None:
    from falkirk.policies.planning.collector import collect
    from falkirk.policies.store import StoreConfig

    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    for bad in (1.5, -1, True):
        with pytest.raises(ValueError, match=r"retain_hours=.*whole number of hours"):
            collect(store, "d", retain_hours=bad)
    assert list(tmp_path.iterdir()) == []  # nothing was created, not even the ledger


def test_a_declared_product_is_kept_whole_though_a_task_reads_it() -> None:
    """src's output is read by agg, so its old epochs are logs a collection may delete, unless
    src declares it a product; the dry run's text says which is which."""
    from falkirk.policies.planning.chains import DataEdge, TaskGraph
    from falkirk.policies.planning.collector import Product, plan_collection

    def rows(product: bool) -> list[LedgerEntry]:
        out = [LedgerEntry(dag_id="d", task_id="src", epoch=e, regime="batch(log_outputs=true)", run_id=f"epoch-{e}", try_number=1, notified_through=e,
                           outputs=(OutputRef("output", "/durable/src", "durable", e, 1, product=product),))
               for e in range(1, 6)]
        return out + [LedgerEntry(dag_id="d", task_id="agg", epoch=e, regime="eager_checkpoint", run_id=f"epoch-{e}", try_number=1, state_uri="/durable/agg/state",
                                  notified_through=e, inputs=(InputRef(task_id="src", output="output", through=e),),
                                  outputs=(OutputRef("output", "/durable/agg", "durable", e, 1),))
                      for e in range(1, 6)]

    graph = TaskGraph(("src", "agg"), (DataEdge("src", "output", "agg"),))
    durable = lambda uri, key: True  # noqa: E731
    live = lambda uri: {e: 10 for e in range(1, 6)}  # noqa: E731
    logs = plan_collection("d", rows(False), graph, durable, live)
    assert [(r.task_id, r.what, r.epochs) for r in logs.tables] == [
        ("src", "output", (1, 2, 3, 4, 5)), ("agg", "state", (1, 2, 3, 4))]
    assert logs.products == (Product("agg", "output", "/durable/agg", "read by no task of the DAG"),)
    kept = plan_collection("d", rows(True), graph, durable, live)
    assert [(r.task_id, r.what, r.epochs) for r in kept.tables] == [("agg", "state", (1, 2, 3, 4))]
    assert kept.products == (Product("src", "output", "/durable/src", "declared a product"),
                             Product("agg", "output", "/durable/agg", "read by no task of the DAG"))
    text = kept.describe().splitlines()
    assert "  agg state (checkpoint): epochs 1-4 of /durable/agg/state (40 B)" in text, text
    assert "  src output (product, kept whole: declared a product): /durable/src" in text, text
    assert "  src output (log): epochs 1-5 of /durable/src (50 B)" in logs.describe().splitlines()
