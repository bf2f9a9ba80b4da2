"""The main job, end to end: the reference application (``falkirk_figure1``) through real
Airflow and Spark (Connect), rank's scratch tier lost before epoch 6, the frontier
recovery, and a failure-free run of the same jobs to compare with.

The job runs once (8 epochs of 5,000 events; the README's command uses 40,000), its jobs clients
of the session's Spark Connect server. The tests then check, each on its own evidence:

* the report renders in Chromium with both charts loaded and non-empty;
* every output and state table, and the SQL query-statistics table, equal the
  failure-free run's row for row, with no statistic delivered twice;
* the plan the job printed is exactly the set of task instances Airflow re-ran (their try
  numbers, read back from Airflow), and that set is the one derived by hand below.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from devstack.figure1_demo import DAG_ID, REFERENCE, DemoOutcome, run_demo
from devstack.spark import SparkConnectServer
from falkirk.policies.store.commits import open_table, scan
from falkirk.policies.store.ledger import Ledger
from falkirk.spark_jobs.figure1.data import QUERIES_PER_EPOCH
from falkirk.spark_jobs.figure1.query_store import QueryStatsStore
from falkirk.spark_jobs.figure1.source import ClickstreamSource

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("FALKIRK_ARTIFACTS", ROOT / "artifacts")) / "figure1"
EPOCHS = range(1, 9)
LOSE_AT = 6
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory,
        spark_connect: SparkConnectServer) -> tuple[DemoOutcome, list[str]]:
    printed: list[str] = []

    def progress(message: str) -> None:
        printed.append(message)
        print(message, flush=True)

    outcome = run_demo(tmp_path_factory.mktemp("figure1") / "run", epochs=8, lose_at=LOSE_AT, records=5_000,
                       progress=progress, connect=spark_connect)
    return outcome, printed


def test_the_report_renders_with_both_charts(job) -> None:
    from playwright.sync_api import sync_playwright

    outcome, _ = job
    page_html = outcome.report.read_text()
    assert 'src="timeline.png"' in page_html and 'src="strategies.png"' in page_html
    for name in ("timeline.png", "strategies.png"):
        data = (outcome.report.parent / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, name
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(outcome.report.as_uri())
            page.wait_for_load_state("load")
            images = page.evaluate("""() => Array.from(document.images).map(i => ({
                src: i.getAttribute('src'), w: i.naturalWidth, h: i.naturalHeight, done: i.complete}))""")
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            browser.close()
    assert [i["src"] for i in images] == ["timeline.png", "strategies.png"]
    for image in images:
        assert image["done"] and image["w"] > 400 and image["h"] > 200, image
        # A chart that is drawn has many colours; a blank or broken one has one or two.
        with Image.open(outcome.report.parent / image["src"]) as png:
            colours = png.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 5, f"{image['src']}: blank"
    assert "SOME CHECKS FAILED" not in page_html


def _rows(uri: str) -> list[str]:
    table = open_table(uri)
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in scan(table).to_pylist()) if table else []


def test_every_output_equals_the_failure_free_run(job) -> None:
    outcome, _ = job
    store = outcome.store
    lost = f"{store.scratch_uri}/{DAG_ID}/rank/"
    uris = set()
    for entry in Ledger(store).entries(REFERENCE):
        uris.update(o.uri for o in entry.outputs)
        uris.add(entry.state_uri) if entry.state_uri else None
    assert len(uris) == 8  # five outputs, rank's state in two tiers, stats' state
    for ref_uri in sorted(uris):
        uri = ref_uri.replace(f"/{REFERENCE}/", f"/{DAG_ID}/")
        ref, got = _rows(ref_uri), _rows(uri)
        assert ref, ref_uri
        if uri.startswith(lost):  # the lost scratch holds what was written again since the loss
            epochs = sorted({json.loads(r)["epoch"] for r in got})
            assert epochs == [4, 5, 6, 7, 8], uri
            ref = [r for r in ref if json.loads(r)["epoch"] in epochs]
        assert got == ref, f"{uri}: {len(got)} rows, the failure-free run has {len(ref)}"

    ours = QueryStatsStore.for_dag(store.durable_uri, DAG_ID)
    theirs = QueryStatsStore.for_dag(store.durable_uri, REFERENCE)
    rows = ours.rows()
    assert rows == theirs.rows()
    assert len(rows) == len(EPOCHS) * QUERIES_PER_EPOCH
    assert Counter(r[0] for r in rows) == {e: QUERIES_PER_EPOCH for e in EPOCHS}
    with sqlite3.connect(ours.path) as db:
        duplicates = db.execute("SELECT epoch, query_id, COUNT(*) FROM query_stats GROUP BY epoch, query_id "
                                "HAVING COUNT(*) > 1").fetchall()
        delivered = db.execute("SELECT epoch FROM deliveries ORDER BY epoch").fetchall()
    assert duplicates == []
    assert [e for (e,) in delivered] == list(EPOCHS)
    assert any(r[-1] > 0 for r in rows) and any(r[-2] > 0 for r in rows)  # real ranks, not defaults


def test_the_printed_plan_is_what_airflow_reran(job) -> None:
    outcome, printed = job
    plan = outcome.plan
    # By hand: rank's scratch (state every epoch, outputs unlogged) is gone, so rank falls back
    # to its durable checkpoint of epoch 3; answers and stats consumed rank's lost epochs 4-5,
    # so they roll back to 3 too; events and popularity (logged) keep everything.
    expected = {(t, e) for t in ("rank", "answers", "stats") for e in range(4, 9)}
    assert set(plan.rerun_set()) == expected
    assert {t.task_id: t.kept_through for t in plan.tasks} == {"events": 8, "popularity": 8, "rank": 3, "answers": 3,
                                                           "stats": 3}
    assert set(outcome.reran) == expected  # the try numbers Airflow reports
    assert plan.table() in "\n".join(printed)
    assert len(plan.clear_downstream_set()) > len(expected)
    assert all(ti["state"] == "success" for ti in outcome.final.values()) and len(outcome.final) == 40
    # events of epochs 1-5 ran before anything downstream had committed, so acknowledged
    # nothing; those of epochs 6-8 acknowledged up to rank's durable checkpoint (epoch 3) less
    # popularity's window: popularity may roll back to 3 with it, and its epoch 4 then reads
    # events 2-4 again. Never what a recovery may re-read (epochs 2-8).
    assert outcome.acknowledged == {5: 0, 8: 1}
    assert ClickstreamSource.for_dag(outcome.store.durable_uri, DAG_ID).acknowledged == 1


def test_every_table_opens_in_sparks_delta_reader(job, spark_connect: SparkConnectServer) -> None:
    """Every table of both runs (durable and scratch, the ledger and control tables too) read by
    Spark's Delta reader over Spark Connect equals what delta-rs reads; each table a task commits
    epochs to travels back to its latest epoch commit with ``versionAsOf``, and ``DESCRIBE
    HISTORY`` names those epochs."""
    from tests.delta_interop import compare, connect_session, tables_under

    outcome, _ = job
    store = outcome.store
    uris = tables_under(store.durable_uri) + tables_under(store.scratch_uri)
    with connect_session(spark_connect.url) as spark:
        found = compare(spark, uris, store)
    assert found.differing == {}
    assert len(uris) >= 20 and sum(found.rows.values()) > 0
    committed = {uri for uri, epochs in found.epochs_in_history.items() if epochs}
    assert committed == set(found.time_travelled)
    for dag in (DAG_ID, REFERENCE):
        assert any(found.epochs_in_history[uri] == set(EPOCHS) for uri in committed if f"/{dag}/" in uri), dag
