"""A lost worker that held two partitions, on the distributed shape (``devstack.cluster``).

``shards_c``, a copy of ``dags/falkirk_shards.py``, runs on Airflow with the CeleryExecutor and
two workers, each with its own scratch disk, its jobs clients of a Spark Connect server on a
Spark standalone cluster that cannot see those disks. Placement puts partitions 0 and 2 of
``totals`` (LazyCheckpoint(every=4): scratch state, durable every fourth epoch) and of
``leaders`` (which reads totals' scratch outputs one-to-one) on worker-a, partitions 1 and 3 on
worker-b. After epoch 5 worker-a is killed and its disk deleted; epoch 6 is triggered, and
its partitions 0 and 2 wait on worker-a's queue. ``falkirk plan --lost-worker worker-a`` re-runs
exactly those two partitions from their durable state of epoch 4, with the readers whose input
changes (and the readers of epoch 6 that waited for them); the replay runs them on worker-b, and every table equals a failure-free run's.
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from pathlib import Path

import pytest

from devstack.cluster import Cluster, ClusterServers
from devstack.demo import run_id_of
from falkirk.plugins.recovery import plan, replay
from falkirk.policies.partitions import processors
from falkirk.policies.regimes import Tier
from falkirk.policies.store.commits import open_table, scan
from falkirk.policies.store.ledger import Ledger
from tests.integration.test_partitions import reference_run
from tests.oracle import canonical

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
DAG, REF = "shards_c", "shards_c_ref"
EPOCHS = list(range(1, 7))
DAG_FILE = '''"""Airflow DAG file: a copy of dags/falkirk_shards.py (a DAG factory) on the distributed shape."""
import importlib.util

_spec = importlib.util.spec_from_file_location("falkirk_shards_dag", {path!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
shards_c = _module.build_dag("shards_c")
'''


def _shards():
    spec = importlib.util.spec_from_file_location("falkirk_shards_dag", ROOT / "dags" / "falkirk_shards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SHARDS = _shards()
PROCESSORS = [p for task, (_, n) in SHARDS.TASKS.items() for p in processors(task, n)]
ON_A = {"totals[0]", "totals[2]", "leaders[0]", "leaders[2]"}


@pytest.fixture(scope="module")
def lost(tmp_path_factory: pytest.TempPathFactory, cluster_servers: ClusterServers):
    root = tmp_path_factory.mktemp("cluster-shards")
    dags = root / "dags"
    dags.mkdir()
    (dags / "shards.py").write_text(DAG_FILE.format(path=str(ROOT / "dags" / "falkirk_shards.py")))
    with Cluster(root / "shape", dags_folder=dags, spark_connect=True, servers=cluster_servers) as cluster:
        client, store = cluster.airflow.client(), cluster.store
        client.wait_for_dag(DAG)
        client.set_paused(DAG, False)
        for e in EPOCHS[:5]:
            client.trigger(DAG, run_id_of(e), SHARDS.EPOCHS.logical_date(e))
        reference_run(REF, store, cluster.connect.url, len(EPOCHS))
        for e in EPOCHS[:5]:
            assert client.wait_for_run(DAG, run_id_of(e), timeout=1800) == "success"
        placed = {(p, e): ti["hostname"] for e in EPOCHS[:5]
                  for p, ti in client.task_instances(DAG, run_id_of(e)).items()}
        cluster.airflow.worker("worker-a").kill()
        shutil.rmtree(cluster.scratch_root("worker-a"), ignore_errors=True)
        client.trigger(DAG, run_id_of(6), SHARDS.EPOCHS.logical_date(6))
        # epoch 6 runs what worker-b holds; partitions 0 and 2 of totals wait on worker-a's queue
        stuck, deadline = {}, time.monotonic() + 900
        while {p for p, ti in stuck.items() if ti["state"] == "success"} != {"events[0]", "events[1]", "totals[1]",
                                                                              "totals[3]"}:
            assert time.monotonic() < deadline, f"epoch 6 did not run what worker-b holds: {stuck}"
            time.sleep(2)
            client.on_poll()
            stuck = client.task_instances(DAG, run_id_of(6))
        p = plan(DAG, store, client, lost_workers=["worker-a"])
        print(p.table())
        replay(p.plan_id, store, client, progress=print)
        assert client.wait_for_run(DAG, run_id_of(6), timeout=1800) == "success"
        after = {(t, e): ti["hostname"] for e in EPOCHS for t, ti in client.task_instances(DAG, run_id_of(e)).items()}
        yield cluster, store, p, placed, stuck, after


def test_placement_spreads_the_partitions_and_keeps_each_with_its_scratch(lost) -> None:
    _, _, _, placed, stuck, _ = lost
    for (proc, epoch), host in placed.items():
        if proc in ON_A:
            assert host == "worker-a", (proc, epoch, host)
        elif proc.startswith(("totals", "leaders")):
            assert host == "worker-b", (proc, epoch, host)
    # epoch 6's partitions 0 and 2 of totals waited on the lost worker's queue
    assert {p: stuck[p]["queue"] for p in ("totals[0]", "totals[2]")} == {"totals[0]": "worker-a",
                                                                          "totals[2]": "worker-a"}


def test_the_plan_reruns_the_lost_partitions_and_their_readers_on_the_live_worker(lost) -> None:
    _, _, p, _, _, after = lost
    # leaders[1] and leaders[3] never ran epoch 6: Airflow's dependency is task-level, and they
    # waited for totals[0] and totals[2] on the lost worker
    assert {t.task_id: list(t.rerun) for t in p.tasks if t.rerun} == {
        "totals[0]": [5, 6], "totals[2]": [5, 6], "leaders[0]": [5, 6], "leaders[2]": [5, 6], "report": [5, 6],
        "leaders[1]": [6], "leaders[3]": [6]}
    assert p.task("totals[0]").restore_from.epoch == 4 and p.task("totals[0]").restore_from.tier == "durable"
    # Airflow would clear both partitions from epoch 1, their first scratch table, with everything after them
    assert len(p.clear_downstream_set()) == 12 + 24 + 6 > len(p.rerun_set()) == 12
    assert {after[k] for k in p.rerun_set() if k[0] != "report"} == {"worker-b"}


def test_every_table_equals_the_failure_free_run(lost) -> None:
    cluster, store, p, _, _, _ = lost
    rows = Ledger(store).entries(DAG)
    uris = {uri for r in rows for uri in (r.state_uri, *(o.uri for o in r.outputs)) if uri}
    gone = {u for u in uris if u.startswith(f"{cluster.scratch_root('worker-a')}/")}
    # events, totals (output, scratch and durable state), leaders, report; and the scratch tables
    # of totals[0] and totals[2] twice: on worker-a's lost disk, then on worker-b's after the recovery
    assert len(uris) == 2 + 3 * 4 + 4 + 1 + 4 and len(gone) == 4
    assert not any(Path(u).exists() for u in gone)
    for uri in sorted(uris - gone):
        ref_uri = uri.replace(f"/{DAG}/", f"/{REF}/")
        if store.is_scratch(uri):  # on a worker's disk: the reference's scratch root has no worker
            ref_uri = store.table_uri(Tier.SCRATCH, REF, *_task_table(uri))
        got, ref = (canonical(scan(open_table(u, store.options_for(u))).to_pylist()) for u in (uri, ref_uri))
        if store.is_scratch(uri):
            epochs = {dict(r)["epoch"] for r in got}
            ref = [r for r in ref if dict(r)["epoch"] in epochs]
            processor = next(r.processor for r in rows if uri in (r.state_uri, *(o.uri for o in r.outputs)))
            if processor in ON_A:  # written on worker-b by the recovery: only what it redid
                assert epochs == set(p.task(processor).rerun), (uri, epochs)
        assert got == ref and got, uri


def _task_table(uri: str) -> tuple[str, str, int]:
    """(task, table, map index) of a table URI ``.../<dag>/<task>[/partition-<i>]/<table>``."""
    parts = uri.rstrip("/").split("/")
    if parts[-2].startswith("partition-"):
        return parts[-3], parts[-1], int(parts[-2][len("partition-"):])
    return parts[-2], parts[-1], -1
