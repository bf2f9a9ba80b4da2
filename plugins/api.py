"""The Falkirk plugin's HTTP API, mounted in the Airflow API server under ``/falkirk``.

Airflow does not authenticate plugin apps by itself, so every route here declares the
same auth dependencies as Airflow's own REST API. A caller needs a valid token (a bearer
header, or the UI's ``_token`` cookie), and:

============================================  =====================================
route                                         needs
============================================  =====================================
``GET  /api/v1/dags/{dag_id}/view``           read access to the DAG
``GET  /api/v1/dags/{dag_id}/ledger``         read access to the DAG
``GET  /api/v1/dags/{dag_id}/regimes``        read access to the DAG
``GET  /api/v1/dags/{dag_id}/recoveries``     read access to the DAG
``POST /api/v1/dags/{dag_id}/preview``        read access to the DAG
``POST /api/v1/dags/{dag_id}/recoveries``     edit access to the DAG's task instances
``POST /api/v1/dags/{dag_id}/lease/release``  edit access to the DAG's task instances
``GET  /ui/falkirk.js``                       any signed-in user (the view's code)
============================================  =====================================

No token gets 401, too little access 403, an unknown DAG 404, a body that does not
validate 422 with the field named in ``detail[].loc``. A replay clears task instances
through Airflow's REST API with the caller's own token, so Airflow checks it again. The
OpenAPI schema is at ``/falkirk/openapi.json`` and rendered at ``/falkirk/docs``.

Example::

    curl -H "Authorization: Bearer $TOKEN" http://127.0.0.1:8080/falkirk/api/v1/dags/falkirk_clicks/view
    curl -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \\
         -d '{"failed_tasks": [{"task_id": "clean", "epoch": 4}]}' \\
         http://127.0.0.1:8080/falkirk/api/v1/dags/falkirk_clicks/preview
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.core_api.security import (
    GetUserDep,
    bearer_scheme,
    collect_request_tokens,
    requires_access_dag,
)
from airflow.configuration import conf
from airflow.models.dagrun import DagRun
from airflow.models.serialized_dag import SerializedDagModel
from airflow.models.taskinstance import TaskInstance
from airflow.utils.session import create_session
from airflow.utils.types import DagRunTriggeredByType
from deltalake.exceptions import DeltaError
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from sqlalchemy import or_, select

from falkirk.plugins.airflow_rest import AirflowClient, AirflowError
from falkirk.plugins.asset_recovery import with_consumers
from falkirk.plugins.discard import Discard, beyond_note, discard, plan_discard, rows_beyond
from falkirk.plugins.grid_status import CheckpointGrid, current_epochs, grid_from_ledger, trimmed, unrecorded, with_runs

# Through the operator module, so that the API server (and the scheduler, which loads this plugin)
# has imported the operator and the Spark provider when it starts: imported later, inside a
# database transaction (creating a run's task instances), a cold import held SQLite's write lock
# for a minute and stalled every component. The functions live in task_metadata.
from falkirk.plugins.operators import epoch_clock_of, partition_outlets_of, partitions_of, regime_of
from falkirk.plugins.recovery import compute_plan
from falkirk.plugins.replay.executor import check_replay
from falkirk.plugins.shared_computations import SharedComputations
from falkirk.plugins.store_hook import FalkirkStoreHook
from falkirk.plugins.supervised import RECOVERY_DAG, trigger_recovery
from falkirk.plugins.view import DagTask, dag_view, epoch_progress, plan_view, recovery_history
from falkirk.policies.asset_events import run_date
from falkirk.policies.epochs import EpochClock, runs_by_epoch
from falkirk.policies.ids import IdError, ProcessorId, check_dag_id
from falkirk.policies.partitions import processors
from falkirk.policies.planning.recovery import (
    BadEpoch,
    FailedTask,
    Failure,
    LostScratch,
    LostWorker,
    PlanError,
    RecoveryPlan,
)
from falkirk.policies.planning.recovery_log import AlreadyReplayed, LeaseHeld, NoLease, RecoveryLog, live_lease
from falkirk.policies.regimes import Regime
from falkirk.policies.store import StoreConfig, StoreError
from falkirk.policies.store.commits import StoreUnreachable, UnreadableTable
from falkirk.policies.store.control import Collections
from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerSnapshot, entries_of
from falkirk.policies.store.readability import StoreReadability
from falkirk.policies.store.steps import StepLog

log = logging.getLogger(__name__)
UI = Path(__file__).resolve().parent / "ui"

def _valid_dag_id(request: Request) -> None:
    """Every route's ``dag_id`` is an id Airflow accepts (:mod:`falkirk.policies.ids`), checked
    before the route reads or writes anything: 422 naming the path parameter."""
    dag_id = request.path_params.get("dag_id")
    if dag_id is not None:
        try:
            check_dag_id(dag_id, "dag_id")
        except IdError as exc:
            raise HTTPException(status_code=422, detail=[{"loc": ["path", "dag_id"], "msg": str(exc),
                                                          "type": "value_error"}]) from None


app = FastAPI(
    dependencies=[Depends(_valid_dag_id)],
    title="Falkirk",
    version="1",
    description="Checkpoints, rollback frontiers and replay for Airflow pipelines of Spark jobs. "
                "Every route needs an Airflow token; see each route for the access it needs.",
)

ReadDag = Depends(requires_access_dag("GET"))
EditTaskInstances = Depends(requires_access_dag("PUT", DagAccessEntity.TASK_INSTANCE))
DeleteRuns = Depends(requires_access_dag("DELETE", DagAccessEntity.RUN))

MAX_BODY_BYTES = 1024 * 1024  # a request body larger than this is refused (413) before it is parsed
MAX_ITEMS = 256  # failures named in one request
MAX_EPOCH = 10**9
CSRF_HEADER = "x-falkirk-request"  # the view sends it; a cross-site form cannot


class _LimitBody:
    """ASGI middleware: refuse a body over ``MAX_BODY_BYTES`` (declared or streamed) with 413."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
            return await _too_large(send)
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > MAX_BODY_BYTES:
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _BodyTooLarge:
            await _too_large(send)


class _BodyTooLarge(Exception):
    pass


async def _too_large(send: Any) -> None:
    body = (f'{{"detail":"request body over {MAX_BODY_BYTES} bytes; name at most {MAX_ITEMS} '
            f'failures per request"}}').encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


app.add_middleware(_LimitBody)


@app.exception_handler(HTTPException)
async def _invalid_token_is_401(request: Request, exc: HTTPException):
    # Airflow answers 403 for a token it cannot verify; a credential that is not valid is 401.
    if exc.status_code == 403 and exc.detail == "Invalid JWT token":
        exc = HTTPException(status_code=401, detail="Invalid token: sign in again", headers={"WWW-Authenticate": "Bearer"})
    return await http_exception_handler(request, exc)


@app.exception_handler(UnreadableTable)
@app.exception_handler(StoreUnreachable)
async def _unreadable_table(request: Request, exc: UnreadableTable | StoreUnreachable) -> JSONResponse:
    return JSONResponse(status_code=503, content={"detail": str(exc)})


@app.exception_handler(DeltaError)
async def _damaged_store(request: Request, exc: DeltaError) -> JSONResponse:
    return JSONResponse(status_code=503, content={
        "detail": f"the Falkirk store cannot be read: {exc}. A table's _delta_log is damaged: restore it from a "
                  f"backup. Nothing was changed."})


def _not_cross_site(request: Request, bearer: HTTPAuthorizationCredentials | None = Depends(bearer_scheme)) -> None:
    """A state-changing request carries the token in its Authorization header, or comes from the
    view (which sends ``X-Falkirk-Request``): the UI's cookie alone, which a page on another
    site can make a browser send, is refused."""
    if bearer is None and request.headers.get(CSRF_HEADER) is None:
        raise HTTPException(status_code=403, detail=f"a state-changing request needs the token in the Authorization "
                                                    f"header (or the {CSRF_HEADER} header the Falkirk view sends)")


# -- request bodies ---------------------------------------------------------------------------


class TaskEpoch(BaseModel):
    """One task instance, by task and epoch (epoch N is the DAG run ``epoch-N``)."""

    model_config = ConfigDict(extra="forbid")
    task_id: str = Field(min_length=1, max_length=250, examples=["clean"])
    epoch: StrictInt = Field(ge=1, le=MAX_EPOCH, examples=[4])


class FailureSpec(BaseModel):
    """The failures to recover from; name at least one."""

    model_config = ConfigDict(extra="forbid")
    failed_tasks: list[TaskEpoch] = Field(default=[], max_length=MAX_ITEMS, description="task instances that failed")
    lost_scratch: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        default=[], max_length=MAX_ITEMS, description="scratch locations whose contents are gone")
    lost_workers: list[Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.\-]+$")]] = Field(
        default=[], max_length=MAX_ITEMS, description="workers gone with their local disks (scratch tiers)")
    bad_epochs: list[TaskEpoch] = Field(default=[], max_length=MAX_ITEMS, description="task epochs whose results are wrong")


class ReplayRequest(FailureSpec):
    """A replay of the plan for these failures, as previewed at ``ledger_version``."""

    ledger_version: StrictInt | None = Field(ge=0, description="the DAG's ledger version the preview showed (its "
                                                   "rows and rollbacks; other DAGs' commits leave it as it is); the "
                                                   "replay is refused (409) if it has changed since")


class ReleaseRequest(BaseModel):
    """Why the DAG's lease is released by hand (recorded in the recovery log with the caller)."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=2000, examples=["the executor's host was lost"])


class DiscardRequest(BaseModel):
    """The newest epochs of a DAG to withdraw (``falkirk discard``), as previewed at ``ledger_version``."""

    model_config = ConfigDict(extra="forbid")
    first: StrictInt = Field(ge=1, le=MAX_EPOCH, examples=[15])
    last: StrictInt = Field(ge=1, le=MAX_EPOCH, examples=[329])
    ledger_version: StrictInt | None = Field(default=None, ge=0, description="for the discard itself: the DAG's "
                                             "ledger version its preview showed; refused (409) if it has changed")
    consumers: bool = Field(default=False, description="withdraw too the epochs of other DAGs that read these "
                            "through an Asset (without it such a discard is refused, 422)")


# -- helpers ----------------------------------------------------------------------------------


_STORE_TTL_SECONDS = 30.0
_store_cache: list[tuple[float, StoreConfig]] = []


def _store() -> StoreConfig:
    """The deployment's store (:class:`FalkirkStoreHook`), looked up at most every 30 s: a
    connection lookup is a metadata-database query, and a preview must not wait on one."""
    now = time.monotonic()
    if _store_cache and now - _store_cache[0][0] < _STORE_TTL_SECONDS:
        return _store_cache[0][1]
    try:
        store = FalkirkStoreHook().get_store()
    except StoreError as exc:
        raise HTTPException(status_code=503, detail=f"the Falkirk store is not configured: {exc}") from exc
    _store_cache[:] = [(now, store)]
    return store


def _invalid(loc: list[str | int], msg: str) -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors, naming the field."""
    return HTTPException(status_code=422, detail=[{"loc": ["body", *loc], "msg": msg, "type": "value_error"}])


def _dag_tasks(dag_id: str) -> list[DagTask]:
    """The DAG's tasks, read in a session of its own that ends here: plan computations that
    follow never hold one of the metadata database's connections."""
    with create_session() as session:
        dag = SerializedDagModel.get_dag(dag_id, session=session)
    if dag is None:
        raise HTTPException(status_code=404, detail=f"DAG {dag_id!r} is not in the metadata database")
    tasks = []
    for t in dag.tasks:
        regime, clock = regime_of(t), epoch_clock_of(t)
        tasks.append(DagTask(t.task_id, regime.spec() if regime else None, tuple(sorted(t.upstream_task_ids)),
                             clock.spec() if clock else None, partitions_of(t), partition_outlets_of(t)))
    return tasks


def _runs_at_epochs(dag_id: str, tasks: list[DagTask], run_ids: set[str] | None = None) -> dict[int, str]:
    """The DAG runs (the newest, or those of ``run_ids``) at their epochs, placed by the epoch
    clock the operator serialized and the rule the CLI uses over REST
    (:func:`falkirk.policies.epochs.runs_by_epoch`): a run's logical date, else the date of the
    partition it runs; runs off the clock's grid are left out (their tasks fail naming the grid)."""
    spec = next((t.epoch_clock for t in tasks if t.epoch_clock), None)
    if spec is None or run_ids == set():
        return {}
    # Runs of `airflow dags test` are no epochs of the DAG: their tasks write to a store of their own.
    query = select(DagRun.run_id, DagRun.logical_date, DagRun.partition_date, DagRun.partition_key).where(
        DagRun.dag_id == dag_id, or_(DagRun.triggered_by.is_(None), DagRun.triggered_by != DagRunTriggeredByType.TEST))
    if run_ids is not None:
        query = query.where(DagRun.run_id.in_(sorted(run_ids)[:MAX_UNPLACED_RUNS]))
    with create_session() as session:
        rows = session.execute(query.order_by(DagRun.run_after.desc()).limit(MAX_UNPLACED_RUNS)).all()
    return runs_by_epoch(((run_id, run_date(logical, partition, key)) for run_id, logical, partition, key in rows),
                         EpochClock.parse(spec))


_previews = SharedComputations()

# The newest runs the view places without ledger rows: the ones a person looks at.
MAX_UNPLACED_RUNS = 1000


def _failures(spec: FailureSpec, tasks: list[DagTask], store: StoreConfig, last_epoch: int) -> list[Failure]:
    """The spec's failures, each checked against the DAG and the store (422 naming the field)."""
    known = {t.task_id for t in tasks} | {p for t in tasks for p in processors(t.task_id, t.partitions, t.replicas)}
    failures: list[Failure] = []
    for field in ("failed_tasks", "bad_epochs"):
        for i, item in enumerate(getattr(spec, field)):
            if item.task_id not in known:
                raise _invalid([field, i, "task_id"], f"task {item.task_id!r} is not in the DAG; "
                                                      f"use one of {sorted(known)}")
            if item.epoch > last_epoch:
                raise _invalid([field, i, "epoch"], f"epoch {item.epoch} has no DAG run; "
                                                    f"the last epoch is {last_epoch}")
            kind = FailedTask if field == "failed_tasks" else BadEpoch
            failures.append(kind(item.task_id, item.epoch))
    for i, location in enumerate(spec.lost_scratch):
        try:
            failures.append(LostScratch(store.scratch_location(location)))
        except StoreError as exc:
            raise _invalid(["lost_scratch", i], str(exc)) from None
    failures += [LostWorker(name) for name in spec.lost_workers]
    if not failures:
        raise _invalid([], "name at least one failure: failed_tasks, lost_scratch, lost_workers or bad_epochs")
    return failures


def _plan(dag_id: str, spec: FailureSpec, record: bool):
    store = _store()
    tasks = _dag_tasks(dag_id)
    snapshot = LedgerSnapshot(Ledger(store), dag_id)  # the one read of the DAG's rows and rollbacks
    entries, rolled_back = entries_of(snapshot.rows, snapshot.gone)
    if not entries:
        raise HTTPException(status_code=409, detail=f"the ledger has no rows for DAG {dag_id!r} yet; "
                                                    f"nothing can be rolled back before it has run")
    # A plan covers the epochs up to the DAG's latest run: past the ledger's newest row when the
    # newest runs committed nothing yet (their first task failed), before it when rows of runs
    # deleted since remain (see falkirk.plugins.discard). With no run on the grid, the ledger's.
    last = max(_runs_at_epochs(dag_id, tasks), default=None) or max(e.epoch for e in [*entries, *rolled_back])
    failures = _failures(spec, tasks, store, last)
    last = max([last, *(f.epoch for f in failures if isinstance(f, (FailedTask, BadEpoch)))])
    regimes = {p: Regime.parse(t.regime) for t in tasks if t.regime for p in processors(t.task_id, t.partitions, t.replicas)}
    try:
        return compute_plan(dag_id, store, failures, regimes, last_epoch=last, record=record, snapshot=snapshot)
    except PlanError as exc:
        raise _invalid([], str(exc)) from exc


def _consumer_plans(dag_id: str, plan: RecoveryPlan, record: bool) -> list[RecoveryPlan]:
    """The plans of the DAGs that read, through an Asset, an epoch ``plan`` redoes (and of the
    DAGs reading those), producers first: the rest of the plan across DAGs
    (:func:`falkirk.plugins.asset_recovery.with_consumers`)."""
    def regimes(dag: str) -> dict[ProcessorId, Regime]:
        try:
            tasks = _dag_tasks(dag)
        except HTTPException:  # in the ledger, no longer in Airflow: planned from its rows alone
            return {}
        return {p: Regime.parse(t.regime) for t in tasks if t.regime
                for p in processors(t.task_id, t.partitions, t.replicas)}

    try:
        return list(with_consumers(plan, _store(), regimes, record=record).plans[1:])
    except PlanError as exc:
        raise _invalid([], str(exc)) from exc


def _may_clear(dag_id: str, user: Any) -> bool:
    return get_auth_manager().is_authorized_dag(
        method="PUT", access_entity=DagAccessEntity.TASK_INSTANCE, details=DagDetails(id=dag_id), user=user)


def _may_discard(dag_id: str, user: Any) -> bool:
    """Whether ``user`` may do a discard's writes in ``dag_id``: delete its runs, change its task instances."""
    manager = get_auth_manager()
    return _may_clear(dag_id, user) and manager.is_authorized_dag(
        method="DELETE", access_entity=DagAccessEntity.RUN, details=DagDetails(id=dag_id), user=user)


def _caller_token(request: Request, bearer: HTTPAuthorizationCredentials | None) -> str:
    tokens = collect_request_tokens(request, bearer)
    if not tokens:  # the auth dependency already refused such a caller; kept for safety
        raise HTTPException(status_code=401, detail="Not authenticated")
    return tokens[0]


def _airflow_url() -> str:
    return conf.get("api", "base_url", fallback="http://127.0.0.1:8080").rstrip("/")


# -- routes -----------------------------------------------------------------------------------


@app.get("/api/v1/health")
def health(user: GetUserDep) -> dict[str, Any]:
    """Whether the plugin is loaded and can see its store, and who is asking (the Airflow user
    the CLI records as the executor of a replay)."""
    return {"status": "ok", "ledger": Ledger(_store()).uri, "user": user.get_name()}


@app.get("/api/v1/dags/{dag_id}/view", dependencies=[ReadDag])
def view(dag_id: str, user: GetUserDep) -> dict[str, Any]:
    """Everything the Falkirk view shows at load: the DAG's tasks with their regimes and upstream
    tasks, the grid of checkpoint statuses (one letter per epoch, see ``statuses``), Airflow's
    state of the instances that are not plainly successful, the failed instances (preselected
    as the failure), scratch locations, the workers holding scratch data, the ledger version, whether the caller may replay, and
    the history of recoveries."""
    store = _store()
    tasks = _dag_tasks(dag_id)
    with create_session() as session:
        rows = session.execute(select(TaskInstance.task_id, TaskInstance.map_index, TaskInstance.run_id,
                                      TaskInstance.state).where(
            TaskInstance.dag_id == dag_id, (TaskInstance.state != "success") | TaskInstance.state.is_(None))).all()
    live = {(ProcessorId(task=task, map_index=index), run): (str(state.value if hasattr(state, "value") else state) if state else None)
            for task, index, run, state in rows}
    snapshot = LedgerSnapshot(Ledger(store), dag_id)  # one read of the ledger and one of its rollbacks
    version = snapshot.dag_version
    collected = Collections(store).through(dag_id)
    # Scratch cells are read as the planner reads them: a deleted directory shows as lost.
    readable = StoreReadability(store, lambda: entries_of(snapshot.rows, set())[0])
    grid = grid_from_ledger(snapshot, dag_id, [p for t in tasks for p in processors(t.task_id, t.partitions, t.replicas)],
                            collected_through=collected, readable=readable, collected=readable.collected)
    # Runs with no ledger row at all (each of their task instances failed or has not run yet).
    grid = with_runs(grid, _runs_at_epochs(dag_id, tasks, {run for _, run in live} - set(grid.runs.values())))
    events = RecoveryLog(store).events(dag_id)
    # While a recovery runs, its rolled-back instances are successful until it clears them.
    lost = [] if live_lease(events, dag_id) else unrecorded(grid, _succeeded_without_row(dag_id, tasks, grid),
                                                            collected)
    can_replay = get_auth_manager().is_authorized_dag(
        method="PUT", access_entity=DagAccessEntity.TASK_INSTANCE, details=DagDetails(id=dag_id), user=user)
    workers = snapshot.workers_holding_scratch()
    # Epochs past the DAG's latest run show only while current rows remain there (runs deleted,
    # their rows not discarded yet); what a discard rolled back beyond it is history.
    last_run = max(_runs_at_epochs(dag_id, tasks), default=0)
    grid = trimmed(grid, max([last_run, *current_epochs(grid)], default=0))
    body = dag_view(dag_id, tasks, grid, live, events, store.scratch_uri, version,
                    can_replay, unrecorded=lost, workers=sorted(workers),
                    progress=epoch_progress(StepLog(store).of_dag(dag_id)))
    body["user"] = user.get_name()
    body["can_discard"] = can_replay and get_auth_manager().is_authorized_dag(
        method="DELETE", access_entity=DagAccessEntity.RUN, details=DagDetails(id=dag_id), user=user)
    body["last_run_epoch"] = last_run or grid.last_epoch
    beyond = rows_beyond(snapshot.entries(), last_run) if last_run else None
    body["beyond"] = beyond_note(dag_id, last_run, beyond) if beyond else None
    body["pairs"] = _pairs(store, dag_id)
    return body


def _pairs(store: StoreConfig, dag_id: str) -> dict[str, Any] | None:
    """The DAG's process pairs (``None``: it has none): each replica's worker, status and
    generation, and what happened to them (take-overs, catch-ups, fold-ins), newest last."""
    from falkirk.policies.pairs import layout_events
    from falkirk.policies.store.control import PairLayouts

    layouts = PairLayouts(store)
    records = layouts.history(dag_id)
    layout = layouts.current(records)
    if layout is None:
        return None
    replicas = [{"name": r.name, "task_id": r.task, "partition": r.partition, "replica": r.replica,
                 "processor": r.id.processor, "worker": r.worker,
                 "status": r.status.value, "generation": r.generation} for r in layout.replicas]
    return {"replicas": replicas, "events": [asdict(e) for e in layout_events(records)]}


def _succeeded_without_row(dag_id: str, tasks: list[DagTask], grid: CheckpointGrid) -> set[tuple[str, str]]:
    """The (task, run) pairs Airflow reports successful among the grid's missing or rolled-back cells of
    Falkirk tasks (at most the newest 1,000 such runs: the cells a person looks at)."""
    cells = {(p, e) for t in tasks if t.regime for p in processors(t.task_id, t.partitions, t.replicas) for e in grid.runs
             if 1 <= e <= grid.last_epoch and grid.status.get(p, "")[e - 1:e] in ("-", "I")}
    runs = [grid.runs[e] for e in sorted({e for _, e in cells}, reverse=True)[:1000]]
    missing = {(t, grid.runs[e]) for t, e in cells}
    if not runs:
        return set()
    with create_session() as session:
        rows = session.execute(select(TaskInstance.task_id, TaskInstance.map_index, TaskInstance.run_id).where(
            TaskInstance.dag_id == dag_id, TaskInstance.state == "success", TaskInstance.run_id.in_(runs))).all()
    return {(ProcessorId(task=t, map_index=m), r) for t, m, r in rows if (ProcessorId(task=t, map_index=m), r) in missing}


@app.post("/api/v1/dags/{dag_id}/preview", dependencies=[ReadDag])
def preview(dag_id: str, spec: FailureSpec, user: GetUserDep) -> dict[str, Any]:
    """The recovery plan for ``spec``, computed and not recorded: each task's frontier, the exact
    re-run set, and what Airflow's clear-downstream from each failure would re-run. ``across``:
    the plans of the other DAGs that read an epoch it redoes through an Asset, each with whether
    the caller may replay it (edit its task instances).

    Previews of the same failures of a DAG asked at once share one computation that starts after
    each of them arrived (:class:`SharedComputations`): a view opened by many people at once
    costs one or two plans, not one per request, and no answer is older than its request."""
    def compute() -> dict[str, Any]:
        plan = _plan(dag_id, spec, record=False)
        return {**plan_view(plan), "across": [plan_view(p) for p in _consumer_plans(dag_id, plan, record=False)]}

    body = _previews((dag_id, spec.model_dump_json()), compute)
    return {**body, "across": [{**p, "may_replay": _may_clear(p["dag_id"], user)} for p in body["across"]]}


@app.post("/api/v1/dags/{dag_id}/recoveries", dependencies=[EditTaskInstances, Depends(_not_cross_site)],
          status_code=202)
def start_recovery(
    dag_id: str,
    spec: ReplayRequest,
    request: Request,
    user: GetUserDep,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> dict[str, Any]:
    """Roll back and replay: record the plan for ``spec``, check with the caller's token that it
    can run (the store still holds what it restores, the DAG's lease is free, Airflow lets the
    caller clear its task instances: a dry run), then start a run of the ``falkirk_recovery`` DAG
    that carries it out (:mod:`falkirk.plugins.supervised`). Answers 202 once that run is
    queued; the recovery's progress is that run's task log, its outcome appears in ``GET
    .../recoveries``. 409 when the ledger changed since the preview, another recovery of the DAG
    is running, or the plan already ran."""
    plan = _plan(dag_id, spec, record=False)
    if plan.ledger_version != spec.ledger_version:
        raise HTTPException(status_code=409, detail=f"the DAG's ledger changed since the preview (version "
                                                    f"{spec.ledger_version} then, {plan.ledger_version} now); "
                                                    f"preview again")
    consumers = _consumer_plans(dag_id, plan, record=False)
    refused = [p.dag_id for p in consumers if not _may_clear(p.dag_id, user)]
    if refused:
        raise HTTPException(status_code=403, detail=f"this recovery re-runs task instances of {', '.join(refused)} "
                                                    f"(they read what it redoes, through an Asset), which you "
                                                    f"({user.get_name()}) may not clear; nothing was run")
    store = _store()
    log_ = RecoveryLog(store)
    for p in (plan, *consumers):
        log_.record(p)
    if consumers:
        log_.link([plan, *consumers])  # each DAG's history names the others' plans
    client = AirflowClient(_airflow_url(), token=_caller_token(request, bearer))
    try:
        check_replay(plan.plan_id, store, client)
    except (AlreadyReplayed, LeaseHeld, PlanError) as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from exc
    except AirflowError as exc:
        raise HTTPException(status_code=502, detail=f"Airflow refused to clear the task instances: {exc}") from exc
    try:
        run_id = trigger_recovery(client, plan.plan_id, [p.plan_id for p in consumers], holder=user.get_name())
    except AirflowError as exc:
        raise HTTPException(status_code=502, detail=f"Airflow did not start the {RECOVERY_DAG} DAG, which carries "
                                                    f"recoveries out ({exc}); add the provider's DAG bundle "
                                                    f"(docs/howto/recover.md) and let this user trigger it") from exc
    return {"plan_id": plan.plan_id, "status": "queued", "by": user.get_name(),
            "recovery": {"dag_id": RECOVERY_DAG, "run_id": run_id}, "rerun_count": len(plan.rerun_set()),
            "across": [{"dag_id": p.dag_id, "plan_id": p.plan_id, "rerun_count": len(p.rerun_set())}
                       for p in consumers]}


@app.post("/api/v1/dags/{dag_id}/discards/preview", dependencies=[EditTaskInstances, DeleteRuns])
def preview_discard(dag_id: str, spec: DiscardRequest, request: Request,
                    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]) -> dict[str, Any]:
    """What discarding epochs ``first..last`` withdraws (the ledger rows per task, the DAG runs
    deleted), changing nothing; 422 naming the fix when the discard would leave the DAG
    inconsistent (not its newest epochs, a run still running, an epoch delivered or collected)."""
    _dag_tasks(dag_id)
    found = _discard_plan(dag_id, spec, AirflowClient(_airflow_url(), token=_caller_token(request, bearer)))
    return _discard_json(found)


@app.post("/api/v1/dags/{dag_id}/discards", dependencies=[EditTaskInstances, DeleteRuns, Depends(_not_cross_site)])
def make_discard(dag_id: str, spec: DiscardRequest, request: Request, user: GetUserDep,
                 bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]) -> dict[str, Any]:
    """Discard epochs ``first..last`` (see :mod:`falkirk.plugins.discard`): their ledger rows are
    rolled back, their DAG runs deleted with the caller's token, and the discard recorded in the
    history. 409 when the ledger changed since the preview or a recovery holds the DAG's lease."""
    _dag_tasks(dag_id)
    client = AirflowClient(_airflow_url(), token=_caller_token(request, bearer))
    found = _discard_plan(dag_id, spec, client)
    if spec.ledger_version is None or found.plan.ledger_version != spec.ledger_version:
        raise HTTPException(status_code=409, detail=f"the DAG's ledger changed since the preview (version "
                                                    f"{spec.ledger_version} then, {found.plan.ledger_version} now); "
                                                    f"preview again")
    refused = [d.plan.dag_id for c in found.consumers for d in c.every() if not _may_discard(d.plan.dag_id, user)]
    if refused:
        raise HTTPException(status_code=403, detail=f"the discard withdraws epochs of {', '.join(sorted(set(refused)))}"
                                                    f", whose runs Airflow does not let this user delete or clear")
    try:
        done = discard(dag_id, _store(), client, spec.first, spec.last, holder=user.get_name(), progress=log.info,
                       consumers=spec.consumers)
    except (LeaseHeld, PlanError) as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from exc
    return {**_discard_json(done), "by": user.get_name(), "status": "finished"}


def _discard_plan(dag_id: str, spec: DiscardRequest, client: AirflowClient) -> Discard:
    if spec.last < spec.first:
        raise _invalid(["last"], f"{spec.last} is before first={spec.first}: give first <= last")
    try:
        return plan_discard(dag_id, _store(), client, spec.first, spec.last, consumers=spec.consumers)
    except PlanError as exc:
        raise _invalid([], str(exc)) from exc


def _discard_json(found: Discard) -> dict[str, Any]:
    return {"plan_id": found.plan.plan_id, "dag_id": found.plan.dag_id, "first": found.first, "last": found.last,
            "ledger_version": found.plan.ledger_version, "rows": len(found.rows), "runs": list(found.runs),
            "next_epoch": found.next_epoch, "summary": found.describe(),
            "consumers": [_discard_json(c) for c in found.consumers]}


@app.post("/api/v1/dags/{dag_id}/lease/release", dependencies=[EditTaskInstances, Depends(_not_cross_site)])
def release_lease(dag_id: str, spec: ReleaseRequest, user: GetUserDep) -> dict[str, Any]:
    """End the DAG's recovery (or collection) lease by hand, for an executor known to be dead
    (audited as ``released``, with the caller and the reason); the same as ``falkirk release``.
    The plan is resumed by replaying it again. 409 when no lease is held."""
    _dag_tasks(dag_id)
    if not spec.reason.strip():
        raise _invalid(["reason"], "say why the lease is released (it is recorded in the recovery log)")
    try:
        held = RecoveryLog(_store()).release(dag_id, by=user.get_name(), reason=spec.reason)
    except NoLease as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from exc
    return {"dag_id": dag_id, "plan_id": held.plan_id, "holder": held.holder, "since": held.since.isoformat(),
            "released_by": user.get_name()}


@app.get("/api/v1/dags/{dag_id}/recoveries", dependencies=[ReadDag])
def recoveries(dag_id: str) -> dict[str, Any]:
    """The DAG's recoveries, newest first: failures, re-run counts, who ran each, when, and the outcome."""
    _dag_tasks(dag_id)
    return {"dag_id": dag_id, "recoveries": recovery_history(RecoveryLog(_store()).events(dag_id))}


@app.get("/api/v1/dags/{dag_id}/ledger", dependencies=[ReadDag])
def dag_ledger(dag_id: str) -> dict[str, Any]:
    """Every checkpoint recorded for ``dag_id``, ordered by epoch and task (404 for a DAG Airflow does not know)."""
    _dag_tasks(dag_id)
    entries = Ledger(_store()).entries(dag_id)
    return {"dag_id": dag_id, "total_entries": len(entries), "entries": [_entry_json(e) for e in entries]}


@app.get("/api/v1/dags/{dag_id}/regimes", dependencies=[ReadDag])
def dag_regimes(dag_id: str) -> dict[str, Any]:
    """Each task's fault-tolerance regime, epoch clock, partition count and whether its asset
    events carry partition keys, read from the serialized DAG (no DAG file is imported)."""
    tasks = [{"task_id": t.task_id, "regime": t.regime, "epoch_clock": t.epoch_clock, "partitions": t.partitions,
              "partition_outlets": t.partition_outlets} for t in _dag_tasks(dag_id)]
    return {"dag_id": dag_id, "tasks": sorted(tasks, key=lambda t: t["task_id"])}


@app.get("/ui/falkirk.js", include_in_schema=False)
def bundle(user: GetUserDep) -> FileResponse:
    """The view's code (a React component rendered by Airflow's UI)."""
    return FileResponse(UI / "falkirk.js", media_type="text/javascript", headers={"Cache-Control": "no-cache"})


def _entry_json(entry: LedgerEntry) -> dict[str, Any]:
    data = asdict(entry)
    data["committed_at"] = entry.committed_at.isoformat()
    data["frontier"] = entry.frontier
    data["output_rows"] = entry.output_rows
    return data
