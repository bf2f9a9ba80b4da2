"""The Falkirk view in Airflow's UI and the API behind it, with real Airflow, Spark (Connect),
Delta and headless Chromium (Debian's package, driven by Playwright). Airflow's metadata is on
the session's PostgreSQL server: the replay the view starts clears task instances over REST while
tasks report their state, and on SQLite that clear (its audit-log row committed on the API
server's event loop) can stop the API server for SQLite's minute-long busy timeout.

``clicks_ui`` (a copy of falkirk_clicks: source Ephemeral -> clean Batch(log) -> model
LazyCheckpoint(every=3) -> sink EagerCheckpoint) runs epochs 1-4; clean's epoch 3 is
killed before it commits, so model and sink of epoch 3 are upstream_failed and, as they
depend on their past, those of epoch 4 never start. Then:

* the API refuses anonymous callers (401), a viewer's replay (403), bad bodies (422,
  naming the field) and unknown DAGs (404), and none of them changes the ledger or a
  task instance;
* the viewer sees the view, with the replay action disabled;
* the admin opens the view, sees the graph, the grid and the preselected failure, checks
  that the preview highlights exactly the plan's re-run set, confirms the replay, and sees
  the cleared task instances re-run to success;
* the view of ``falkirk_wide`` (50 tasks x 500 epochs of ledger history) loads in under 2 s.

Screenshots of each step are written to ``artifacts/falkirk-view/`` (or
``$FALKIRK_ARTIFACTS``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from devstack.airflow import USERS, AirflowStack, migrated_database
from devstack.demo import run_id_of
from devstack.spark import SparkConnectServer
from falkirk.plugins.airflow_rest import AirflowClient
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import COMPACT_EVERY, InputRef, Ledger, LedgerEntry, OutputRef, SCHEMA
from falkirk.policies.workers import worker_name
from falkirk.spark_jobs.clicks.feed import clicks_for_epoch, deliver
from tests.integration.browser import ARTIFACTS, chromium, shot, sign_in
from tests.integration.recovery.drill import wait_states
from tests.sentinel import checksum

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DAG = "clicks_ui"
WIDE = "falkirk_wide"
TASKS = ("source", "clean", "model", "sink")
EPOCHS = (1, 2, 3, 4)


@dataclass
class ViewStack:
    stack: AirflowStack
    store: StoreConfig
    admin: AirflowClient

    def token(self, user: str) -> str:
        return AirflowClient(self.stack.base_url, user, USERS[user][1]).token


def _wide_module():
    spec = importlib.util.spec_from_file_location("view_dags", HERE / "view_dags" / "view_dags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_wide_history(store: StoreConfig, epochs: int = 500) -> int:
    """50 tasks x ``epochs`` ledger rows for falkirk_wide, one Delta commit per epoch, shaped as
    the runtime writes them (state and output tiers follow each task's regime)."""
    graph = _wide_module().wide_graph()
    ledger = Ledger(store)
    for epoch in range(1, epochs + 1):
        rows = []
        for task, (regime, ups) in graph.items():
            out = regime.output_tier(epoch).value
            state = regime.state_tier(epoch)
            rows.append(LedgerEntry(
                dag_id=WIDE, task_id=task, epoch=epoch, regime=regime.spec(), run_id=run_id_of(epoch), try_number=1,
                state_uri=f"{store.durable_uri}/{WIDE}/{task}/state" if state else None,
                state_tier=state.value if state else None, state_version=epoch if state else None,
                outputs=(OutputRef("output", f"{store.durable_uri}/{WIDE}/{task}/output", out, epoch, 10),),
                inputs=tuple(InputRef(task_id=u, output="output", through=epoch) for u in ups), notified_through=epoch).to_row())
        write_deltalake(ledger.uri, pa.Table.from_pylist(rows, schema=SCHEMA), mode="append")
        if epoch % COMPACT_EVERY == 0:
            ledger.compact()  # as Ledger.append does every COMPACT_EVERY versions
    return len(graph) * epochs


@pytest.fixture(scope="module")
def view_stack(tmp_path_factory: pytest.TempPathFactory, spark_connect: SparkConnectServer, postgres):  # noqa: ANN001
    root = tmp_path_factory.mktemp("view")
    store = StoreConfig(str(root / "durable"), str(root / "scratch"))
    inbox, faults = root / "inbox", root / "faults"
    for e in EPOCHS:
        deliver(inbox, DAG, e, clicks_for_epoch(e))
    faults.write_text(f"{DAG}/clean:3:before-commit\n")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    stack = AirflowStack(home=root / "airflow", store=store, dags_folder=HERE / "view_dags",
                         database_url=migrated_database(postgres, "view"), extra_env={
        **spark_connect.airflow_env(),
        "FALKIRK_INBOX": str(inbox), "FALKIRK_CRASH_AT": f"@{faults}"})
    stack.init()
    stack.start()
    try:
        client = stack.client()
        from devstack.demo import dag_epoch_clock

        clock = dag_epoch_clock(ROOT / "dags" / "falkirk_clicks.py")
        client.wait_for_dag(DAG)
        client.wait_for_dag(WIDE)
        client.set_paused(DAG, False)
        for e in EPOCHS:
            client.trigger(DAG, run_id_of(e), clock.logical_date(e))
        print(f"wrote {write_wide_history(store)} ledger rows for {WIDE}")
        ok = {t: {"success"} for t in TASKS}
        wait_states(client, DAG, {1: ok, 2: ok, 3: {"source": {"success"}, "clean": {"failed"},
                                                    "model": {"upstream_failed"}, "sink": {"upstream_failed"}},
                                  4: {"source": {"success"}, "clean": {"success"}, "model": {None}, "sink": {None}}})
        faults.write_text("")  # the cause is fixed; a re-run succeeds
        yield ViewStack(stack, store, client)
    finally:
        stack.stop()


# -- the API ---------------------------------------------------------------------------------


def snapshot(vs: ViewStack) -> tuple:
    """The ledger's version and every task instance's (state, try number): what must not change."""
    tis = {(e, t): (ti["state"], ti["try_number"]) for e in EPOCHS
           for t, ti in vs.admin.task_instances(DAG, run_id_of(e)).items()}
    return Ledger(vs.store).version(), tis


def call(vs: ViewStack, method: str, path: str, user: str | None, body: object = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {vs.token(user)}"} if user else {}
    return httpx.request(method, f"{vs.stack.base_url}/falkirk/api/v1/{path}", headers=headers, json=body, timeout=60)


def test_api_refuses_and_changes_nothing(view_stack: ViewStack) -> None:
    vs = view_stack
    before = snapshot(vs)
    failure = {"failed_tasks": [{"task_id": "clean", "epoch": 3}]}
    version = call(vs, "GET", f"dags/{DAG}/view", "admin").json()["ledger_version"]
    replay = {**failure, "ledger_version": version}

    for method, path, body in (("GET", f"dags/{DAG}/view", None), ("POST", f"dags/{DAG}/preview", failure),
                               ("POST", f"dags/{DAG}/recoveries", replay), ("GET", f"dags/{DAG}/recoveries", None),
                               ("GET", f"dags/{DAG}/ledger", None), ("GET", "health", None)):
        r = call(vs, method, path, None, body)
        assert r.status_code == 401, (method, path, r.status_code, r.text)
    assert httpx.get(f"{vs.stack.base_url}/falkirk/ui/falkirk.js").status_code == 401

    r = call(vs, "POST", f"dags/{DAG}/recoveries", "viewer", replay)
    assert r.status_code == 403, r.text
    assert call(vs, "GET", f"dags/{DAG}/view", "viewer").json()["can_replay"] is False
    assert call(vs, "POST", f"dags/{DAG}/preview", "viewer", failure).status_code == 200  # reading is allowed

    bad = [
        ({"failed_tasks": [{"task_id": "clean", "epoch": 0}]}, ["body", "failed_tasks", 0, "epoch"]),
        ({"failed_tasks": [{"task_id": "nope", "epoch": 3}]}, ["body", "failed_tasks", 0, "task_id"]),
        ({"failed_tasks": [{"task_id": "clean", "epoch": 99}]}, ["body", "failed_tasks", 0, "epoch"]),
        ({"bad_epochs": [{"task_id": "clean"}]}, ["body", "bad_epochs", 0, "epoch"]),
        ({"lost_scratch": ["/elsewhere"]}, ["body", "lost_scratch", 0]),
        ({"failed_task": [{"task_id": "clean", "epoch": 3}]}, ["body", "failed_task"]),
        ({}, ["body"]),
    ]
    for body, loc in bad:
        for path, extra in ((f"dags/{DAG}/preview", {}), (f"dags/{DAG}/recoveries", {"ledger_version": version})):
            r = call(vs, "POST", path, "admin", {**body, **extra})
            assert r.status_code == 422, (path, body, r.text)
            assert r.json()["detail"][0]["loc"] == loc, (path, body, r.json())
    r = call(vs, "POST", f"dags/{DAG}/recoveries", "admin", failure)  # no ledger_version
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "ledger_version"]
    r = call(vs, "POST", f"dags/{DAG}/recoveries", "admin", {**failure, "ledger_version": version - 1})
    assert r.status_code == 409 and "preview again" in r.json()["detail"]

    for method, path, body in (("GET", "dags/nope/view", None), ("POST", "dags/nope/preview", failure),
                               ("POST", "dags/nope/recoveries", replay), ("GET", "dags/nope/recoveries", None)):
        r = call(vs, method, path, "admin", body)
        assert r.status_code == 404 and "'nope'" in r.json()["detail"], (method, path, r.text)

    assert snapshot(vs) == before
    assert call(vs, "GET", f"dags/{DAG}/recoveries", "admin").json()["recoveries"] == []
    schema = httpx.get(f"{vs.stack.base_url}/falkirk/openapi.json").json()
    assert {"/api/v1/dags/{dag_id}/view", "/api/v1/dags/{dag_id}/preview",
            "/api/v1/dags/{dag_id}/recoveries"} <= set(schema["paths"])


def _forged(vs: ViewStack, user: str, secret: str, **claims) -> str:
    """``user``'s real token with ``claims`` changed, signed with ``secret``."""
    import jwt

    real = vs.token(user)
    header = jwt.get_unverified_header(real)
    body = {**jwt.decode(real, options={"verify_signature": False}), **claims}
    return jwt.encode(body, secret, algorithm=header["alg"], headers={"kid": header.get("kid")} if header.get("kid")
                      else None)


def test_every_credential_and_hostile_input_is_refused_naming_the_field(view_stack: ViewStack,
                                                                         tmp_path: Path) -> None:
    """Anonymous, viewer, admin, a token signed with another secret, an expired token and the
    UI's cookie alone, on every route; then hostile bodies and paths. Each refusal is 401, 403,
    404, 413 or 422 naming the field, and nothing changes: not the ledger, not Airflow, not a
    sentinel directory outside the store (checksummed)."""
    vs = view_stack
    sentinel = tmp_path / "sentinel"
    (sentinel / "table" / "_delta_log").mkdir(parents=True)
    (sentinel / "table" / "_delta_log" / "00000000000000000000.json").write_text("{}")
    (sentinel / "keep.txt").write_text("must survive")
    before = (snapshot(vs), checksum(sentinel), checksum(Path(vs.store.durable_uri)))
    base = f"{vs.stack.base_url}/falkirk/api/v1"
    version = call(vs, "GET", f"dags/{DAG}/view", "admin").json()["ledger_version"]
    failure = {"failed_tasks": [{"task_id": "clean", "epoch": 3}]}
    routes = [("GET", f"dags/{DAG}/view", None), ("GET", f"dags/{DAG}/ledger", None),
              ("GET", f"dags/{DAG}/regimes", None), ("GET", f"dags/{DAG}/recoveries", None),
              ("POST", f"dags/{DAG}/preview", failure), ("GET", "health", None),
              ("POST", f"dags/{DAG}/recoveries", {**failure, "ledger_version": version})]
    now = int(time.time())
    credentials = {
        "anonymous": ({}, 401),
        "another secret": ({"Authorization": f"Bearer {_forged(vs, 'admin', 'not-the-secret-' * 5)}"}, 401),
        "expired": ({"Authorization": "Bearer " + _forged(vs, "admin", vs.stack.jwt_secret, iat=now - 7200,
                                                          nbf=now - 7200, exp=now - 3600)}, 401),
        "garbage": ({"Authorization": "Bearer not.a.jwt"}, 401),
    }
    for who, (headers, status) in credentials.items():
        for method, path, body in routes:
            r = httpx.request(method, f"{base}/{path}", headers=headers, json=body, timeout=60)
            assert r.status_code == status, (who, method, path, r.status_code, r.text)
    # The viewer reads everything and changes nothing.
    for method, path, body in routes:
        r = call(vs, method, path, "viewer", body)
        assert r.status_code == (403 if path.endswith("recoveries") and method == "POST" else 200), (path, r.text)
    # The UI's cookie alone reads, but cannot change state: a page on another site could send it.
    cookie = {"_token": vs.token("admin")}
    assert httpx.get(f"{base}/dags/{DAG}/view", cookies=cookie, timeout=60).status_code == 200
    r = httpx.post(f"{base}/dags/{DAG}/recoveries", cookies=cookie, json=routes[-1][2], timeout=60)
    assert r.status_code == 403 and "Authorization" in r.json()["detail"], r.text

    # Hostile bodies, as admin: each a 422 naming the field (or 413 for the size).
    outside = [str(sentinel), "/", f"{vs.store.scratch_uri}/../durable", f"{vs.store.scratch_uri}/../../",
               vs.store.durable_uri, "s3://bucket/x", "\u00e9t\u00e9/\u2603", "\x00"]
    hostile = [({"lost_scratch": [where]}, ["body", "lost_scratch", 0]) for where in outside]
    hostile += [({"failed_tasks": [{"task_id": task, "epoch": 3}]}, ["body", "failed_tasks", 0, "task_id"])
                for task in ("../../etc", "/", "\u2603", "x" * 251, "")]
    hostile += [({"bad_epochs": [{"task_id": "clean", "epoch": epoch}]}, ["body", "bad_epochs", 0, "epoch"])
                for epoch in (-1, 0, 10**12, 10**30, "4", True, 1.5, None)]
    hostile += [({"failed_tasks": [{"task_id": "clean", "epoch": 3}] * 257}, ["body", "failed_tasks"]),
                ({"lost_scratch": "not a list"}, ["body", "lost_scratch"]),
                ([], ["body"])]
    for body, loc in hostile:
        for path, extra in ((f"dags/{DAG}/preview", {}), (f"dags/{DAG}/recoveries", {"ledger_version": version})):
            r = call(vs, "POST", path, "admin", {**body, **extra} if isinstance(body, dict) else body)
            assert r.status_code == 422, (path, body, r.status_code, r.text[:300])
            assert r.json()["detail"][0]["loc"] == loc, (path, body, r.json())
    headers = {"Authorization": f"Bearer {vs.token('admin')}", "Content-Type": "application/json"}
    huge = json.dumps({"lost_scratch": ["/" + "x" * 1000] * 3000})  # about 3 MB
    for path in (f"dags/{DAG}/preview", f"dags/{DAG}/recoveries"):
        r = httpx.post(f"{base}/{path}", headers=headers, content=huge, timeout=60)
        assert r.status_code == 413 and "request body over" in r.json()["detail"], r.text[:300]
        r = httpx.post(f"{base}/{path}", headers=headers, content=b"{not json", timeout=60)
        assert r.status_code == 422, r.text[:300]
    # Hostile DAG ids in the path: never a table of another DAG or a path outside the store. An id
    # Airflow would refuse is 422 naming the path parameter; one holding a slash matches no route.
    for dag in ("%2E%2E", "..%2F..%2Fetc", "%E2%98%83", "x" * 300, str(sentinel).replace("/", "%2F"), "a%20b"):
        for method, route, body in routes[:5]:
            r = httpx.request(method, f"{base}/{route.replace(DAG, dag)}", headers=headers, json=body, timeout=60)
            if "%2F" in dag:
                assert r.status_code == 404, (dag, route, r.status_code, r.text[:300])
            else:
                assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "dag_id"], (
                    dag, route, r.status_code, r.text[:300])

    assert (snapshot(vs), checksum(sentinel), checksum(Path(vs.store.durable_uri))) == before
    assert call(vs, "GET", f"dags/{DAG}/recoveries", "admin").json()["recoveries"] == []


def test_the_api_schema_and_docs_are_public_and_hold_no_data(view_stack: ViewStack) -> None:
    """Decision: ``/falkirk/openapi.json`` and ``/falkirk/docs`` describe the routes, as
    Airflow's own ``/openapi.json`` does, and hold no data of any DAG or store: they need no
    token. Everything under ``/falkirk/api`` and ``/falkirk/ui`` does."""
    vs = view_stack
    schema = httpx.get(f"{vs.stack.base_url}/falkirk/openapi.json", timeout=60)
    docs = httpx.get(f"{vs.stack.base_url}/falkirk/docs", timeout=60)
    assert schema.status_code == 200 and docs.status_code == 200 and "swagger" in docs.text.lower()
    for text in (schema.text, docs.text):
        assert vs.store.durable_uri not in text and vs.store.scratch_uri not in text and DAG not in text
    assert set(schema.json()["paths"]) == {"/api/v1/health", "/api/v1/dags/{dag_id}/view",
                                           "/api/v1/dags/{dag_id}/preview", "/api/v1/dags/{dag_id}/recoveries",
                                           "/api/v1/dags/{dag_id}/ledger", "/api/v1/dags/{dag_id}/regimes",
                                           "/api/v1/dags/{dag_id}/lease/release", "/api/v1/dags/{dag_id}/discards",
                                           "/api/v1/dags/{dag_id}/discards/preview"}


def test_concurrent_previews_share_their_plans_and_airflow_keeps_serving(view_stack: ViewStack) -> None:
    """50, then 200 previews at once: every one answers 200 with the same plan (identical
    previews asked together share one computation that starts after each arrived,
    ``SharedComputations``), Airflow's own API keeps answering meanwhile (a preview never holds a
    metadata-database connection while it plans), and the latencies are reported (alone on two
    cores: 50 with p95 0.93-0.95 s, 200 with p95 1.5 s; before the sharing, 7.3 s and 9.9 s)."""
    from concurrent.futures import ThreadPoolExecutor

    vs = view_stack
    token = vs.token("viewer")
    failure = {"failed_tasks": [{"task_id": "clean", "epoch": 3}]}
    url = f"{vs.stack.base_url}/falkirk/api/v1/dags/{DAG}/preview"

    def preview(client: httpx.Client) -> tuple[int, float, str]:
        start = time.monotonic()
        r = client.post(url, headers={"Authorization": f"Bearer {token}"}, json=failure, timeout=600)
        return r.status_code, time.monotonic() - start, r.json().get("plan_id", r.text[:200])

    def burst(n: int) -> tuple[list[tuple[int, float, str]], int, float]:
        # one connection per caller, opened before the clock starts: as n browsers already on the page
        clients = [httpx.Client() for _ in range(n)]
        try:
            with ThreadPoolExecutor(max_workers=n) as pool:
                list(pool.map(lambda c: c.get(f"{vs.stack.base_url}/falkirk/api/v1/health",
                                              headers={"Authorization": f"Bearer {token}"}), clients))
                started = time.monotonic()
                answers = pool.map(preview, clients)
                airflow = httpx.get(f"{vs.stack.base_url}/api/v2/monitor/health", timeout=120).status_code
                answers = list(answers)
            return answers, airflow, time.monotonic() - started
        finally:
            for c in clients:
                c.close()

    for n in (50, 200):
        answers, airflow, wall = burst(n)
        assert airflow == 200
        assert [a[0] for a in answers] == [200] * n, Counter(a[0] for a in answers)
        assert len({a[2] for a in answers}) == 1  # one plan, however many asked
        latencies = sorted(a[1] for a in answers)
        p50, p95 = latencies[n // 2 - 1], latencies[int(n * 0.95) - 1]
        print(f"{n} concurrent previews: {wall:.1f} s in all; latency p50 {p50:.2f} s, p95 {p95:.2f} s, "
              f"max {latencies[-1]:.2f} s")
        assert wall < 600


# -- the browser -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    yield from chromium()


def login(browser, vs: ViewStack, user: str, theme: str = "light"):
    """A new browser context signed in through Airflow's own login form."""
    return sign_in(browser, vs.stack.base_url, user, theme)


FALKIRK_TAB = "a[href$='/plugin/falkirk']"  # the tab the plugin adds to every DAG page


def open_view(page, vs: ViewStack, dag: str, suffix: str = "plugin/falkirk"):
    started = time.monotonic()
    page.goto(f"{vs.stack.base_url}/dags/{dag}/{suffix}")
    page.get_by_test_id("falkirk-view").wait_for(timeout=60_000)
    return time.monotonic() - started


def cells(page, attr: str, value: str) -> set[tuple[str, int]]:
    found = page.eval_on_selector_all(f"[data-testid^=cell-][{attr}='{value}']",
                                      "els => els.map(e => e.dataset.testid)")
    out = set()
    for testid in found:
        _, rest = testid.split("-", 1)
        task, epoch = rest.rsplit("-", 1)
        out.add((task, int(epoch)))
    return out


def test_viewer_sees_the_view_but_cannot_replay(view_stack: ViewStack, browser) -> None:
    context, page = login(browser, view_stack, "viewer", theme="dark")
    try:
        open_view(page, view_stack, DAG)
        page.get_by_test_id("plan").wait_for(timeout=60_000)
        button = page.get_by_test_id("replay-button")
        assert button.is_disabled()
        assert "need edit access" in button.get_attribute("title")
        shot(page, "viewer-dark-replay-disabled")
        # from a task instance: that instance is the preselected failure
        open_view(page, view_stack, DAG, "runs/epoch-3/tasks/clean/plugin/falkirk-task")
        assert page.get_by_test_id("failed-clean-3").is_checked()
        assert page.get_by_test_id("selected-failures").inner_text().strip() == ""
        # from a successful one: nothing is preselected (no plan at once); the bad-epoch picker
        # holds that instance, one click from its plan
        open_view(page, view_stack, DAG, "runs/epoch-4/tasks/source/plugin/falkirk-task")
        assert not page.get_by_test_id("failed-clean-3").is_checked()
        assert page.get_by_test_id("selected-failures").inner_text().strip() == ""
        assert page.get_by_test_id("preview-empty").is_visible()
        assert (page.get_by_test_id("bad-task").input_value(), page.get_by_test_id("bad-epoch").input_value()) == (
            "source", "4")
        shot(page, "viewer-dark-from-a-successful-task-instance")
        page.get_by_test_id("add-bad-epoch").click()
        assert page.get_by_test_id("chip-bad-0").inner_text().startswith("bad source @ 4")
        page.get_by_test_id("plan").wait_for(timeout=60_000)
        shot(page, "viewer-dark-bad-epoch-added")
        # a lost worker: the ledger names the machine that committed the scratch tables; its plan
        # is the API's for that failure, highlighted cell for cell
        page.get_by_test_id("chip-bad-0").get_by_role("button").click()
        machine = worker_name()
        assert page.get_by_test_id("worker-select").input_value() == machine
        page.get_by_test_id("add-worker").click()
        assert page.get_by_test_id(f"chip-worker-{machine}").inner_text().startswith(f"lost worker {machine}")
        page.get_by_test_id("plan").wait_for(timeout=60_000)
        preview = call(view_stack, "POST", f"dags/{DAG}/preview", "viewer", {"lost_workers": [machine]}).json()
        page.wait_for_function("id => document.querySelector('[data-testid=plan]').dataset.planId === id",
                               arg=preview["plan_id"], timeout=60_000)
        assert cells(page, "data-rerun", "true") == {(t, e) for t, e in preview["rerun"]}
        assert "lost worker " + machine in preview["failures"]
    finally:
        context.close()
    r = call(view_stack, "POST", f"dags/{DAG}/recoveries", "viewer",
             {"failed_tasks": [{"task_id": "clean", "epoch": 3}], "ledger_version": Ledger(view_stack.store).dag_version(DAG)})
    assert r.status_code == 403


def test_admin_previews_and_replays_from_the_view(view_stack: ViewStack, browser) -> None:
    vs = view_stack
    context, page = login(browser, vs, "admin")
    try:
        open_view(page, vs, DAG)
        shot(page, "1-view-loaded")
        # the graph, coloured by regime
        regimes = {t: page.get_by_test_id(f"graph-node-{t}").get_attribute("data-regime") for t in TASKS}
        assert regimes == {"source": "ephemeral", "clean": "batch", "model": "lazy_checkpoint",
                           "sink": "eager_checkpoint"}
        # the grid: what the ledger holds (clean's epoch 3 never committed, nor model and sink since)
        status = {t: "".join(page.get_by_test_id(f"cell-{t}-{e}").get_attribute("data-status") for e in EPOCHS)
                  for t in TASKS}
        assert status == {"source": "SSSS", "clean": "LL-L", "model": "SS--", "sink": "DD--"}
        assert cells(page, "data-airflow-state", "failed") == {("clean", 3)}
        assert cells(page, "data-airflow-state", "upstream_failed") == {("model", 3), ("sink", 3)}
        # blocked by depends_on_past: marked waiting, as Airflow's grid shows them
        assert cells(page, "data-airflow-state", "cleared") == {("model", 4), ("sink", 4)}
        assert page.get_by_test_id("cell-model-4").get_attribute("class").split()[-1] == "fk-waiting"
        # the failure Airflow reports is preselected, and the preview shows its plan
        assert page.get_by_test_id("failed-clean-3").is_checked()
        page.get_by_test_id("plan").wait_for()
        plan_id = page.get_by_test_id("plan").get_attribute("data-plan-id")
        preview = call(vs, "POST", f"dags/{DAG}/preview", "admin",
                       {"failed_tasks": [{"task_id": "clean", "epoch": 3}]}).json()
        assert plan_id == preview["plan_id"]
        expected = {(t, e) for t, e in preview["rerun"]}
        # clean's epoch 4 is kept (its epochs are independent); model and sink redo 3 and 4
        assert expected == {("clean", 3), ("model", 3), ("model", 4), ("sink", 3), ("sink", 4)}
        assert cells(page, "data-rerun", "true") == expected  # exactly the plan's re-run set is highlighted
        assert int(page.get_by_test_id("rerun-count").inner_text()) == 5
        assert int(page.get_by_test_id("clear-count").inner_text()) == preview["clear_downstream_count"] == 6
        assert page.get_by_test_id("frontier-model").get_attribute("data-frontier") == "2"
        # every epoch is kept, re-run, or has not run yet: none is left unexplained
        assert {t: page.get_by_test_id(f"kept-{t}").inner_text() for t in TASKS} == {
            "source": "1-4", "clean": "1-2, 4", "model": "1-2", "sink": "1-2"}
        assert {t: page.get_by_test_id(f"not-run-{t}").inner_text() for t in TASKS} == {
            "source": "-", "clean": "-", "model": "-", "sink": "-"}
        check_legend_and_graph(page)
        shot(page, "2-preview")

        page.get_by_test_id("replay-button").click()
        dialog = page.get_by_test_id("confirm-dialog")
        assert "clears 5 task instances" in dialog.inner_text()
        shot(page, "3-confirm")
        page.get_by_test_id("confirm-replay").click()
        page.get_by_test_id("replay-started").wait_for(timeout=60_000)
        shot(page, "4-replay-started")

        # carried out by a run of falkirk_recovery: the history says when it finished
        deadline = time.monotonic() + 600
        while {r["plan_id"]: r["outcome"] for r in call(vs, "GET", f"dags/{DAG}/recoveries", "admin").json()[
                "recoveries"]}.get(plan_id) != "finished":
            assert time.monotonic() < deadline, "the recovery did not finish"
            page.wait_for_timeout(1000)
        wait_states(vs.admin, DAG, {e: {t: {"success"} for t in TASKS} for e in EPOCHS}, timeout=600)
        page.reload()
        page.get_by_test_id("falkirk-view").wait_for()
        row = page.get_by_test_id(f"history-{plan_id}")
        assert row.get_attribute("data-outcome") == "finished" and "admin" in row.inner_text()
        status = {t: "".join(page.get_by_test_id(f"cell-{t}-{e}").get_attribute("data-status") for e in EPOCHS)
                  for t in TASKS}
        assert status == {"source": "SSSS", "clean": "LLLL", "model": "SSDS", "sink": "DDDD"}
        assert cells(page, "data-airflow-state", "failed") == set()
        # after the recovery, the grid marks exactly the cells it re-ran
        assert cells(page, "data-reran", plan_id) == expected
        shot(page, "5-replayed")
    finally:
        context.close()
    tries = {(t, e): ti["try_number"] for e in (3, 4) for t, ti in vs.admin.task_instances(DAG, run_id_of(e)).items()}
    assert tries == {("source", 3): 1, ("clean", 3): 2, ("model", 3): 1, ("sink", 3): 1,  # clean 3 re-ran
                     ("source", 4): 1, ("clean", 4): 1, ("model", 4): 1, ("sink", 4): 1,  # clean 4 kept
                     ("notify", 3): 1, ("notify", 4): 1}  # not managed: never cleared


def check_legend_and_graph(page) -> None:
    """The legend keeps regimes (node colours) apart from checkpoint statuses (cell colours), with
    no colour meaning two things; each node's badge sits under its label, never over it."""
    groups = {g: page.get_by_test_id(g).inner_text() for g in ("legend-regimes", "legend-statuses", "legend-airflow",
                                                                "legend-plan")}
    assert groups["legend-regimes"].startswith("Regime (node, row swatch)")
    assert "keeps 1-2, 4 (under a node): the epochs the plan shown keeps as they are" in groups["legend-regimes"]
    assert groups["legend-statuses"].startswith("Checkpoint (grid cell)") and "logged outputs" in groups["legend-statuses"]
    assert "waiting (not started, or blocked)" in groups["legend-airflow"]
    assert "re-run by the last recovery" in groups["legend-plan"]
    colours = page.evaluate("""() => Object.fromEntries(['legend-regimes', 'legend-statuses'].map((g) =>
        [g, [...document.querySelectorAll(`[data-testid="${g}"] span[style*="width: 12px"]`)]
              .map((s) => getComputedStyle(s).backgroundColor).filter((c) => c !== 'rgba(0, 0, 0, 0)')]))""")
    # six statuses, and the bar under a cell checkpointed part-way into its epoch (durable's colour)
    assert len(colours["legend-regimes"]) == 4 and len(colours["legend-statuses"]) == 7, colours
    assert len(set(colours["legend-statuses"])) == 6, colours
    assert not set(colours["legend-regimes"]) & set(colours["legend-statuses"]), colours
    badges = {}
    for t in (*TASKS, "notify"):
        label, badge = (page.get_by_test_id(f"graph-{part}-{t}").bounding_box() for part in ("label", "badge"))
        assert badge["y"] >= label["y"] + label["height"], (t, label, badge)  # under the label, not over it
        badges[t] = page.get_by_test_id(f"graph-badge-{t}").text_content()
    assert badges == {"source": "keeps 1-4", "clean": "keeps 1-2, 4", "model": "keeps 1-2", "sink": "keeps 1-2",
                      "notify": "not managed"}
    assert page.get_by_test_id("graph-node-notify").get_attribute("data-regime") == "none"
    assert page.get_by_test_id("grid-unmanaged-notify").inner_text() == "not managed by Falkirk: Airflow alone runs it"
    assert "notify" not in page.get_by_test_id("bad-task").locator("option").all_inner_texts()


def test_admin_releases_a_dead_executors_lease_from_the_view(view_stack: ViewStack, browser) -> None:
    """``falkirk replay`` is SIGKILLed just after taking the DAG's lease. The viewer sees the
    recovery running and no way to release it; the admin releases it from the history with a
    reason, audited in the recovery log; the plan then resumes to the end."""
    import signal
    import subprocess

    from devstack.processes import VENV_BIN
    from falkirk.policies.planning.recovery_log import RecoveryLog

    vs = view_stack
    env = {**os.environ, **vs.store.env(), "FALKIRK_AIRFLOW_URL": vs.stack.base_url, "FALKIRK_AIRFLOW_USER": "admin",
           "FALKIRK_AIRFLOW_PASSWORD": USERS["admin"][1], "FALKIRK_CRASH_AT": f"{DAG}/replay:0:after-lease"}
    falkirk = [str(VENV_BIN / "falkirk")]
    planned = subprocess.run([*falkirk, "plan", "--dag", DAG, "--bad-epoch", "sink:4", "--json"], env=env,
                             capture_output=True, text=True, timeout=300)
    assert planned.returncode == 0, planned.stderr
    plan_id = json.loads(planned.stdout)["plan_id"]
    killed = subprocess.run([*falkirk, "replay", plan_id], env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    context, page = login(browser, vs, "viewer")
    try:
        open_view(page, vs, DAG)
        row = page.get_by_test_id(f"history-{plan_id}")
        assert row.get_attribute("data-outcome") == "running"
        assert page.get_by_test_id(f"release-{plan_id}").count() == 0
        assert not page.get_by_test_id("replay-button").is_enabled()  # a recovery is running
    finally:
        context.close()
    context, page = login(browser, vs, "admin")
    try:
        open_view(page, vs, DAG)
        page.get_by_test_id(f"release-{plan_id}").click()
        dialog = page.get_by_test_id("release-dialog")
        assert "Release it only if its executor is dead" in dialog.inner_text()
        assert not page.get_by_test_id("release-confirm").is_enabled()  # a reason is required
        page.get_by_test_id("release-reason").fill("its falkirk replay was killed")
        shot(page, "6-release-lease")
        page.get_by_test_id("release-confirm").click()
        row = page.get_by_test_id(f"history-{plan_id}")
        deadline = time.monotonic() + 30
        while row.get_attribute("data-outcome") != "released":
            assert time.monotonic() < deadline, row.inner_text()
            page.wait_for_timeout(500)
        assert "released by admin: its falkirk replay was killed" in row.locator("td").nth(6).get_attribute("title")
    finally:
        context.close()
    released = [r for r in RecoveryLog(vs.store).events(DAG) if r["event"] == "released"]
    assert [(r["plan_id"], r["holder"]) for r in released] == [(plan_id, "admin")]
    # Nothing left to release; the plan resumes by the documented path and finishes.
    r = call(vs, "POST", f"dags/{DAG}/lease/release", "admin", {"reason": "again"})
    assert r.status_code == 409 and "nothing to release" in r.json()["detail"]
    env.pop("FALKIRK_CRASH_AT")
    resumed = subprocess.run([*falkirk, "replay", plan_id], env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, resumed.stdout + resumed.stderr
    assert call(vs, "GET", f"dags/{DAG}/recoveries", "admin").json()["recoveries"][0]["outcome"] == "finished"


def test_a_lost_ledger_commit_shows_as_success_without_a_row_and_replays_to_the_same_tables(
        view_stack: ViewStack, browser) -> None:
    """The ledger's newest ``_delta_log`` entry (the last task instance's commit) is deleted, as
    damage or a careless clean-up would. Airflow still says success; the view flags the cell and
    preselects it, ``falkirk plan --failed-task '*'`` includes it, and the replay runs it again:
    its commits are found in place, its ledger row comes back, and no table changes."""
    import subprocess

    from devstack.processes import VENV_BIN
    from falkirk.plugins.view import UNRECORDED
    from tests.integration.recovery.drill import rows as table_rows
    from falkirk.policies.regimes import Tier

    vs = view_stack
    ledger = Ledger(vs.store)
    current = lambda: {(e.task_id, e.epoch) for e in ledger.entries(DAG)}  # noqa: E731
    before = current()
    tables = {t: table_rows(vs.store, DAG, t, "output", tier) for t, tier in (("clean", Tier.DURABLE),
                                                                               ("sink", Tier.DURABLE))}
    log = Path(ledger.uri) / "_delta_log"
    for newest in sorted(log.glob("*.json"), reverse=True)[:2]:  # a compaction (no row of its own) may be newest
        newest.unlink()
        # A checkpoint of that version (one every ten commits) holds the commit too, and goes
        # with it; readers then find the checkpoint before it without the hint.
        for summary in [*log.glob(f"{newest.stem}.checkpoint*.parquet"), log / "_last_checkpoint"]:
            summary.unlink(missing_ok=True)
        if current() != before:
            break
    (task, epoch), = before - current()
    assert client_state(vs, task, epoch) == "success"

    body = call(vs, "GET", f"dags/{DAG}/view", "admin").json()
    assert body["status"][task][epoch - 1] in "-I"
    assert body["airflow_states"][task][str(epoch)] == UNRECORDED
    assert [(f["task_id"], f["epoch"]) for f in body["failed"] if "why" in f] == [(task, epoch)]
    context, page = login(browser, vs, "admin")
    try:
        open_view(page, vs, DAG)
        assert page.get_by_test_id(f"cell-{task}-{epoch}").get_attribute("data-airflow-state") == UNRECORDED
        assert page.get_by_test_id(f"unrecorded-{task}-{epoch}").is_visible()
        assert page.get_by_test_id(f"failed-{task}-{epoch}").is_checked()  # preselected
        shot(page, "7-success-without-ledger-row")
    finally:
        context.close()

    env = {**os.environ, **vs.store.env(), "FALKIRK_AIRFLOW_URL": vs.stack.base_url, "FALKIRK_AIRFLOW_USER": "admin",
           "FALKIRK_AIRFLOW_PASSWORD": USERS["admin"][1], "FALKIRK_CRASH_AT": ""}
    falkirk = [str(VENV_BIN / "falkirk")]
    planned = subprocess.run([*falkirk, "plan", "--dag", DAG, "--failed-task", "*", "--json"], env=env,
                             capture_output=True, text=True, timeout=300)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert {"kind": "failed_task", "task_id": task, "epoch": epoch} in plan["failures"], plan
    assert epoch in next(t["rerun"] for t in plan["tasks"] if t["task_id"] == task), plan
    replayed = subprocess.run([*falkirk, "replay", plan["plan_id"]], env=env, capture_output=True, text=True,
                              timeout=900)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert current() == before  # the row is back ...
    for t, tier in (("clean", Tier.DURABLE), ("sink", Tier.DURABLE)):  # ... and nothing is doubled
        assert table_rows(vs.store, DAG, t, "output", tier) == tables[t], t
    body = call(vs, "GET", f"dags/{DAG}/view", "admin").json()
    assert not [f for f in body["failed"] if "why" in f] and body["status"][task][epoch - 1] not in "-I"


def client_state(vs: ViewStack, task: str, epoch: int) -> str | None:
    return vs.admin.task_instances(DAG, run_id_of(epoch))[task]["state"]


def test_view_of_50_tasks_and_500_epochs_renders_the_latest_epochs_in_a_window(view_stack: ViewStack, browser) -> None:
    """The view of 25,000 ledger rows renders the latest epochs with the ledger's statuses, and
    only the visible window of cells. Its load times are printed, in ms since navigation to the
    DAG's Falkirk tab started (Airflow's UI starts, then loads the view's bundle; the view mounts,
    calls its API and renders the grid's visible window), and since a click on the Falkirk tab of
    the DAG's page. They are a measurement, not a pass mark: on a loaded two-core machine they
    vary between 2 and 4 s from run to run."""
    graph = _wide_module().wide_graph()
    context, page = login(browser, view_stack, "admin")
    try:
        open_view(page, view_stack, WIDE)  # warm: the UI's code is cached, as for a returning user
        timings = []
        for _ in range(3):
            open_view(page, view_stack, WIDE)
            page.wait_for_function("globalThis.__falkirkTimings && globalThis.__falkirkTimings.grid !== undefined")
            t = page.evaluate("globalThis.__falkirkTimings")
            timings.append((t["grid"] / 1000, (t["grid"] - t["evaluated"]) / 1000))
        # as a user gets there: from the DAG's page, a click on its Falkirk tab (no page reload)
        clicks = []
        for _ in range(3):
            page.goto(f"{view_stack.stack.base_url}/dags/{WIDE}")
            page.locator(FALKIRK_TAB).first.wait_for(timeout=60_000)
            clicked = page.evaluate(
                "sel => { const at = performance.now(); document.querySelector(sel).click(); return at; }", FALKIRK_TAB)
            page.wait_for_function(
                "at => globalThis.__falkirkTimings && globalThis.__falkirkTimings.grid > at", arg=clicked, timeout=60_000)
            clicks.append((page.evaluate("globalThis.__falkirkTimings.grid") - clicked) / 1000)
        shot(page, "wide-50x500")
        assert page.get_by_test_id("falkirk-grid").get_attribute("data-epochs") == "500"
        # the latest epochs are in view, with the statuses the ledger holds; the history is ledger
        # rows only, so its scratch-only cells read as lost (no scratch table was ever written)
        codes = {"ephemeral": "X", "batch": "L", "eager_checkpoint": "D"}
        for task, (regime, _) in graph.items():
            expected = codes.get(regime.name) or ("D" if 500 % regime.every == 0 else "X")
            assert page.get_by_test_id(f"cell-{task}-500").get_attribute("data-status") == expected, task
        rendered = page.eval_on_selector_all("[data-testid^=cell-]", "els => els.length")
        assert 50 * 40 <= rendered < 50 * 200  # only the visible window, not 25,000 cells
    finally:
        context.close()
    print(f"\nfalkirk_wide (50 tasks x 500 epochs, {rendered} cells in view): navigation to rendered grid "
          f"{', '.join(f'{a:.2f}s' for a, _ in timings)}; of which the Falkirk view (bundle loaded to grid rendered) "
          f"{', '.join(f'{b:.2f}s' for _, b in timings)}; "
          f"click on the DAG page's Falkirk tab to rendered grid {', '.join(f'{c:.2f}s' for c in clicks)}")


def test_the_trigger_dialog_refuses_a_date_off_the_epoch_grid_and_creates_an_epochs_run(
        view_stack: ViewStack, browser) -> None:
    """Airflow's own Trigger dialog on a DAG scheduled by EpochTimetable (falkirk_wide, paused):
    its default logical date, now, is off the epoch grid, so the trigger is refused in the dialog
    with the reason and the nearest epochs, and no run exists; an epoch's date creates that
    epoch's run, manual__epoch-5."""
    vs = view_stack
    runs = lambda: [(r["dag_run_id"], r["logical_date"]) for r in vs.admin.request(  # noqa: E731
        "GET", f"/api/v2/dags/{WIDE}/dagRuns")["dag_runs"]]
    assert runs() == []
    context, page = login(browser, vs, "admin")
    try:
        page.goto(f"{vs.stack.base_url}/dags/{WIDE}")
        page.get_by_role("button", name="Trigger").first.click()
        dialog = page.get_by_role("dialog")
        unpause = dialog.locator("input[type=checkbox]")  # "Unpause falkirk_wide on trigger": keep it paused
        if unpause.is_checked():
            dialog.locator("label:has(input[type=checkbox])").click()
        dialog.get_by_role("button", name="Trigger").click()
        refusal = dialog.get_by_text("is not an epoch of this DAG")
        refusal.wait_for(timeout=30_000)
        # falkirk_wide has no DAG run yet: the refusal names the epochs nearest the date
        assert "each run is one epoch. Trigger it at an epoch's date (the nearest: epoch" in refusal.inner_text()
        page.screenshot(path=str(ARTIFACTS / "8-trigger-refused-off-the-epoch-grid.png"))
        assert runs() == []

        page.get_by_test_id("datetime-input").click()
        picker = page.locator("[data-scope=popover][data-part=content]").last
        for placeholder, value in (("YYYY/MM/DD", "2026/01/05"), ("HH:mm", "00:00")):
            field = picker.locator(f"input[placeholder='{placeholder}']")
            field.fill(value)
            field.press("Tab")
        page.keyboard.press("Escape")
        assert page.get_by_test_id("datetime-input").inner_text().startswith("Jan 05, 2026 00:00")
        dialog.get_by_role("button", name="Trigger").click()
        page.wait_for_url(lambda url: url.endswith(f"/dags/{WIDE}/runs/manual__epoch-5"), timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "9-trigger-on-an-epoch.png"))
    finally:
        context.close()
    assert runs() == [("manual__epoch-5", "2026-01-05T00:00:00Z")]
    assert vs.admin.request("GET", f"/api/v2/dags/{WIDE}")["is_paused"] is True



def test_an_admin_discards_epochs_left_past_the_latest_run_from_the_view(view_stack: ViewStack, browser) -> None:
    """After the trigger test, falkirk_wide has one DAG run (epoch 5) and ledger rows up to epoch
    500. The view says so and proposes the discard; a viewer may not preview it; the admin
    previews (nothing changes), then discards from the view: the view then ends at epoch 5 and
    the history names the discard and who made it."""
    vs = view_stack
    body = call(vs, "GET", f"dags/{WIDE}/view", "admin").json()
    assert body["last_run_epoch"] == 5 and body["can_discard"] is True
    assert body["beyond"].startswith("the ledger has rows of epochs 6..500 past the DAG's latest run (epoch 5)")
    assert call(vs, "GET", f"dags/{WIDE}/view", "viewer").json()["can_discard"] is False
    assert call(vs, "POST", f"dags/{WIDE}/discards/preview", "viewer", {"first": 6, "last": 500}).status_code == 403
    refused = call(vs, "POST", f"dags/{WIDE}/discards/preview", "admin", {"first": 6, "last": 400})
    assert refused.status_code == 422 and "give --epochs 6-500" in refused.text, refused.text
    version = Ledger(vs.store).dag_version(WIDE)
    context, page = login(browser, vs, "admin")
    try:
        open_view(page, vs, WIDE)
        assert page.get_by_test_id("beyond-note").inner_text() == body["beyond"]
        assert (page.get_by_test_id("discard-first").input_value(), page.get_by_test_id("discard-last").input_value()) \
            == ("6", "500")
        page.get_by_test_id("discard-preview").click()
        summary = page.get_by_test_id("discard-summary")
        summary.wait_for(timeout=60_000)
        assert "t0_0: rolls back 495 ledger rows (epochs 6-500)" in summary.inner_text()
        assert Ledger(vs.store).dag_version(WIDE) == version  # a preview changes nothing
        shot(page, "10-discard-preview")
        page.get_by_test_id("discard-confirm").click()
        page.wait_for_function("() => !document.querySelector('[data-testid=beyond-note]')", timeout=120_000)
        assert page.get_by_test_id("falkirk-grid").get_attribute("data-epochs") == "5"
        shot(page, "11-discarded")
    finally:
        context.close()
    assert max(e.epoch for e in Ledger(vs.store).entries(WIDE)) == 5
    [latest] = call(vs, "GET", f"dags/{WIDE}/recoveries", "viewer").json()["recoveries"][:1]
    assert (latest["failures"], latest["by"], latest["outcome"]) == (["discarded epochs 6..500"], "admin", "finished")


def test_after_falkirk_gc_the_view_shows_collected_epochs_as_collected_the_last_one_included(
        view_stack: ViewStack, browser) -> None:
    """``falkirk gc`` of clicks_ui deletes what no task needs any more, scratch outputs of epochs
    past a task's own collected ledger rows among them (source's output, once clean has logged
    its own): the view shows every such cell as garbage-collected, none as lost."""
    import subprocess

    from devstack.processes import VENV_BIN
    from falkirk.policies.store.control import Collections

    vs = view_stack
    before = call(vs, "GET", f"dags/{DAG}/view", "admin").json()["status"]
    done = subprocess.run([str(VENV_BIN / "falkirk"), "gc", "--dag", DAG], env={**os.environ, **vs.store.env()},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    through = Collections(vs.store).through(DAG)
    reclaimed = {(line.split()[0], e) for line in done.stdout.splitlines() if "(scratch output): epochs" in line
                 for e in _epochs_named(line.split("epochs ", 1)[1].split(" of ")[0])}
    # the scratch-only cells whose output gc deleted past the task's collected rows: the case the
    # view once showed as lost
    past_marks = {(t, e) for t, e in reclaimed if e > through.get(t, 0) and before[t][e - 1] == "S"}
    assert past_marks, (through, reclaimed, before)
    grid = call(vs, "GET", f"dags/{DAG}/view", "admin").json()["status"]
    assert "X" not in "".join(grid.values()), grid
    assert all(grid[t][e - 1] == "G" for t, e in past_marks), (grid, past_marks)
    assert all(grid[t][e - 1] == "G" for t, e in through.items() if e >= 1), (grid, through)
    context, page = login(browser, vs, "admin")
    try:
        open_view(page, vs, DAG)
        shown = {t: "".join(page.get_by_test_id(f"cell-{t}-{e}").get_attribute("data-status") for e in EPOCHS)
                 for t in TASKS}
        assert shown == {t: grid[t][:len(EPOCHS)] for t in TASKS}, shown
        shot(page, "12-collected-after-gc")
    finally:
        context.close()


def _epochs_named(ranges: str) -> list[int]:
    """``1-3, 5`` as ``[1, 2, 3, 5]``."""
    out: list[int] = []
    for part in ranges.split(","):
        first, _, last = part.strip().partition("-")
        out += list(range(int(first), int(last or first) + 1))
    return out
