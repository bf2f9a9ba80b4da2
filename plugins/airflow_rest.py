"""A small client for Airflow 3's REST API v2, authenticated as one user with their own token.

The recovery executor clears task instances through it, the CLI reads failed task
instances with it, and the tests and the demo drive DAG runs with it.

Example::

    client = AirflowClient("http://127.0.0.1:8080", "admin", "admin")
    client.clear("falkirk_orders", "epoch-2", ["aggregate"])
    client.wait_for_run("falkirk_orders", "epoch-2", progress=print)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from falkirk.policies.asset_events import run_date
from falkirk.policies.ids import ProcessorId

log = logging.getLogger(__name__)

TERMINAL_RUN_STATES = {"success", "failed"}
FALKIRK_API = "/falkirk/api/v1"  # the plugin's own routes (falkirk.plugins.api)
# How long a write (a clear, a state change) may take to answer: the API server holds it behind
# the metadata database and the cluster policy's store reads.
WRITE_TIMEOUT = 600.0


# Entries per page of a listing: Airflow's default [api] maximum_page_limit, which caps any larger ask.
PAGE = 100


class AirflowError(RuntimeError):
    """Airflow refused a request or did not reach the state waited for; the message says which."""


def api_path(*segments: object, root: str = "/api/v2") -> str:
    """The path under ``root`` (Airflow's REST API v2; :data:`FALKIRK_API` for the plugin's)
    made of ``segments``, each quoted whole: an id holding ``/``, ``?``, ``%`` or a dot segment
    stays one segment and never names another resource.

    >>> api_path("dags", "falkirk_orders", "dagRuns", "manual__2026-01-03T00:00:00+00:00")
    '/api/v2/dags/falkirk_orders/dagRuns/manual__2026-01-03T00%3A00%3A00%2B00%3A00'
    >>> api_path("dags", "x/../orders"), api_path("dags", ".")
    ('/api/v2/dags/x%2F..%2Forders', '/api/v2/dags/%2E')
    """
    return root + "/" + "/".join(_segment(s) for s in segments)


def _segment(value: object) -> str:
    text = str(value)
    if not text:
        raise AirflowError("an empty id cannot name an Airflow resource")
    # quote() keeps dots: a segment of dots alone would be read as "this" or "the parent"
    return text.replace(".", "%2E") if set(text) == {"."} else quote(text, safe="~")


def _check_path(method: str, path: str) -> None:
    """Refuse a path with a dot segment, which a client or server would resolve to another
    resource (``/dags/x/../orders`` is ``/dags/orders``), or with a query or fragment in it
    (``/dags/orders?x/dagRuns/r`` is ``/dags/orders``): build paths with :func:`api_path`.

    >>> _check_path("DELETE", "/api/v2/dags/orders%3Fx/dagRuns/r")
    >>> _check_path("DELETE", "/api/v2/dags/orders?x/dagRuns/r")
    Traceback (most recent call last):
    ...
    falkirk.plugins.airflow_rest.AirflowError: DELETE /api/v2/dags/orders?x/dagRuns/r: a path segment is '.' or '..', or it holds '?' or '#' (queries go in params); build the path with api_path, which quotes each id
    """
    if "?" in path or "#" in path or any(part in (".", "..") for part in path.split("/")):
        raise AirflowError(f"{method} {path[:200]}: a path segment is '.' or '..', or it holds '?' or '#' (queries "
                           f"go in params); build the path with api_path, which quotes each id")


def _wait_until(what: str, check: Callable[[], bool], timeout: float, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AirflowError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _same_backfill(backfill: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether ``backfill`` (as Airflow's API gives it) covers the dates ``body`` asked for, with its behaviour.

    >>> b = {"from_date": "2026-01-05T00:00:00Z", "to_date": "2026-01-06T00:00:00Z", "reprocess_behavior": "completed"}
    >>> _same_backfill(b, {"from_date": "2026-01-05T00:00:00+00:00", "to_date": "2026-01-06T00:00:00+00:00",
    ...                     "reprocess_behavior": "completed"})
    True
    >>> _same_backfill(b, {**b, "reprocess_behavior": "failed"})
    False
    """
    def when(value: str) -> datetime:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))

    return (when(backfill["from_date"]) == when(body["from_date"]) and when(backfill["to_date"]) == when(body["to_date"])
            and backfill["reprocess_behavior"] == body["reprocess_behavior"])


class AirflowClient:
    """The REST calls the demo and the tests make, authenticated as one user."""

    def __init__(self, base_url: str, username: str | None = None, password: str | None = None,
                 on_poll: Callable[[], None] | None = None, token: str | None = None, refused_seconds: float = 0.0):
        self.base_url = base_url.rstrip("/")
        # How long a call waits for an API server that refuses connections (restarting): 0, fail at once.
        self.refused_seconds = refused_seconds
        self.on_poll = on_poll or (lambda: None)
        self._run_afters: dict[tuple[str, str], tuple[datetime, str] | None] = {}
        self.http = httpx.Client(base_url=self.base_url, timeout=30)
        if token is None:
            if not username or password is None:
                raise AirflowError("Airflow credentials: give a token (FALKIRK_AIRFLOW_TOKEN) or a user name "
                                   "and password (FALKIRK_AIRFLOW_USER, FALKIRK_AIRFLOW_PASSWORD)")
            token = self._token(username, password)
        self.token = token
        self.http.headers["Authorization"] = f"Bearer {self.token}"

    def _token(self, username: str, password: str) -> str:
        refused_until = time.monotonic() + self.refused_seconds
        while True:
            try:
                response = httpx.post(f"{self.base_url}/auth/token", json={"username": username, "password": password},
                                      timeout=30)
                break
            except httpx.ConnectError:  # nothing sent: the API server is down (restarting)
                if time.monotonic() > refused_until:
                    raise
                time.sleep(2)
        if response.status_code >= 400:
            raise AirflowError(f"Airflow at {self.base_url} refused user {username!r} ({response.status_code})")
        return response.json()["access_token"]

    def request(self, method: str, path: str, attempts: int = 4, idempotent: bool = False, missing_ok: bool = False,
                already_ok: bool = False, **kwargs: Any) -> Any:
        """One REST call. A read (GET), or a write the caller marks ``idempotent``, that meets a
        server error is retried: on a loaded machine the API server can give up on a locked SQLite
        file and roll back. A read that times out is retried too. A write waits up to
        :data:`WRITE_TIMEOUT` for its answer and is not sent again after a timeout: the server may
        still be carrying it out, and two clears of one task instance at once collide in Airflow's
        task-instance history. Any call that meets 503 is retried: Airflow answers 503 when it
        refused the call before carrying it out (a backfill on a locked SQLite file). A refused
        connection (nothing sent: the API server restarting) is tried again for up to the client's
        ``refused_seconds``. ``missing_ok``: a 404 answers ``None``; ``already_ok``: a 409 answers
        ``None``, for a call whose only conflict is that the resource is already as it asks."""
        if method != "GET":
            kwargs.setdefault("timeout", httpx.Timeout(30, read=WRITE_TIMEOUT))
        refused_until = time.monotonic() + self.refused_seconds
        attempt = 0
        while attempt < attempts:
            attempt += 1
            retry = (method == "GET" or idempotent) and attempt < attempts
            _check_path(method, path)
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.ConnectError:
                # Nothing was sent: the API server is down (restarting). Any call may wait for it.
                if time.monotonic() > refused_until:
                    raise
                attempt -= 1
                time.sleep(2)
                continue
            except httpx.TimeoutException as exc:
                sent = not isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout))
                if method == "GET" and not retry:
                    raise
                if not retry or sent:
                    raise AirflowError(f"{method} {path}: no answer from {self.base_url} ({exc!r}); "
                                       "whether it was carried out is unknown") from exc
                time.sleep(2 * attempt)
                continue
            refused = response.status_code == 503 and attempt < attempts
            if (response.status_code >= 500 and retry) or refused:
                time.sleep(2 * attempt)
                continue
            break
        if (response.status_code == 404 and missing_ok) or (response.status_code == 409 and already_ok):
            return None
        if response.status_code >= 400:
            raise AirflowError(f"{method} {path} -> {response.status_code}: {response.text[:2000]}")
        return response.json() if response.content else None

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        """Wait until the dag-processor has parsed ``dag_id`` (and report its import errors if any)."""
        def parsed() -> bool:
            self.on_poll()
            return self.http.get(api_path("dags", dag_id)).status_code == 200
        try:
            _wait_until(f"DAG {dag_id} to be parsed", parsed, timeout)
        except AirflowError:
            errors = self.request("GET", "/api/v2/importErrors")
            raise AirflowError(f"DAG {dag_id} did not appear; import errors: {json.dumps(errors)[:3000]}") from None

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.request("PATCH", api_path("dags", dag_id), json={"is_paused": paused})

    def is_paused(self, dag_id: str) -> bool:
        return bool(self.request("GET", api_path("dags", dag_id)).get("is_paused"))

    def trigger(self, dag_id: str, run_id: str, logical_date: datetime, attempts: int = 3,
                conf: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Create the run, with ``conf`` as its params; safe to repeat, since the run id names it.

        A server error or a timeout (a busy metadata database) is retried; a retry that finds
        the run already created (409) returns that run rather than failing.
        """
        body: dict[str, Any] = {"dag_run_id": run_id, "logical_date": logical_date.isoformat()}
        if conf:
            body["conf"] = dict(conf)
        for attempt in range(1, attempts + 1):
            try:
                response = self.http.post(api_path("dags", dag_id, "dagRuns"), json=body)
            except httpx.TimeoutException:
                if attempt == attempts:
                    raise
                time.sleep(2 * attempt)
                continue
            if response.status_code < 400:
                return response.json()
            if response.status_code == 409 and attempt > 1:
                return self.dag_run(dag_id, run_id)
            if response.status_code < 500 or attempt == attempts:
                raise AirflowError(f"POST /api/v2/dags/{dag_id}/dagRuns -> {response.status_code}: {response.text[:2000]}")
            time.sleep(2 * attempt)
        raise AssertionError("unreachable")

    def create_backfill(self, dag_id: str, from_date: datetime, to_date: datetime, reprocess_behavior: str,
                        timeout: float = 300) -> dict[str, Any]:
        """Create a backfill of ``dag_id`` over ``[from_date, to_date]`` and return it.

        On SQLite, Airflow can commit the backfill row and then refuse (503) when creating its
        runs is blocked by a lock; if its own clean-up meets the lock too, the row stays behind
        as a running backfill with no runs, and every retry answers 409 until the scheduler
        withdraws it (two minutes later). A 409 that follows this call's own refusal, with an
        active backfill of this call's dates and behaviour, is that orphan: it is cancelled (it
        has no runs to fail) and the backfill created again. Any other 409 is another user's
        backfill, and is raised.
        """
        body = {"dag_id": dag_id, "from_date": from_date.isoformat(), "to_date": to_date.isoformat(),
                "reprocess_behavior": reprocess_behavior}
        deadline = time.monotonic() + timeout
        refused = False
        attempt = 0
        while True:
            attempt += 1
            response = self.http.post("/api/v2/backfills", json=body,
                                      timeout=httpx.Timeout(30, read=WRITE_TIMEOUT))
            if response.status_code < 400:
                return response.json()
            out_of_time = time.monotonic() > deadline
            if response.status_code == 503 and not out_of_time:
                refused = True
                time.sleep(min(2 * attempt, 10))
                continue
            if response.status_code == 409 and refused and not out_of_time:
                orphans = [b for b in self.request("GET", "/api/v2/backfills", params={"dag_id": dag_id})["backfills"]
                           if b["completed_at"] is None and _same_backfill(b, body)]
                for orphan in orphans:
                    log.info("Backfill %s of %s was left by a refused creation; cancelling it", orphan["id"], dag_id)
                    cancelled = self.http.put(api_path("backfills", orphan["id"], "cancel"),
                                              timeout=httpx.Timeout(30, read=WRITE_TIMEOUT))
                    if cancelled.status_code not in (200, 409):  # 409: already completed
                        raise AirflowError(f"PUT /api/v2/backfills/{orphan['id']}/cancel -> "
                                           f"{cancelled.status_code}: {cancelled.text[:2000]}")
                if orphans:
                    continue
            raise AirflowError(f"POST /api/v2/backfills -> {response.status_code}: {response.text[:2000]}")

    def run_exists(self, dag_id: str, run_id: str) -> bool:
        response = self.http.get(api_path("dags", dag_id, "dagRuns", run_id))
        if response.status_code not in (200, 404):
            raise AirflowError(f"GET /api/v2/dags/{dag_id}/dagRuns/{run_id} -> {response.status_code}: "
                               f"{response.text[:2000]}")
        return response.status_code == 200

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.request("GET", api_path("dags", dag_id, "dagRuns", run_id))

    def find_run(self, dag_id: str, run_id: str) -> dict[str, Any] | None:
        """The DAG run, or ``None`` if Airflow has no such run (deleted, or never created)."""
        return self.request("GET", api_path("dags", dag_id, "dagRuns", run_id), missing_ok=True)

    def dag(self, dag_id: str) -> dict[str, Any]:
        """The DAG as Airflow's API gives it (``is_paused``, ``max_active_runs``, ...)."""
        return self.request("GET", api_path("dags", dag_id))

    def task_instances(self, dag_id: str, run_id: str) -> dict[ProcessorId, dict[str, Any]]:
        """The run's task instances by processor: ``task``, or ``task[i]`` for a mapped one."""
        data = self.request("GET", api_path("dags", dag_id, "dagRuns", run_id, "taskInstances"),
                            params={"limit": 1000})
        return _by_processor(data["task_instances"])

    def runs_with_instances(self, dag_id: str, run_ids: Iterable[str]
                            ) -> dict[str, tuple[dict[str, Any], dict[ProcessorId, dict[str, Any]]]]:
        """Of ``run_ids``, each DAG run Airflow holds with its task instances (keyed as
        :meth:`task_instances` keys them); a run it does not hold (deleted) is left out. Two
        requests (one more per further page of :data:`PAGE`) for all the runs, where reading one
        run at a time takes two requests each: the DAG's task instances, then its runs, both
        between the earliest and the latest wanted run's ``run_after`` (read once per run, then
        kept).

        Both are GET listings. Airflow's POST listing of task instances writes a row of its audit
        log on every call, committed on the API server's event loop: on SQLite that commit waits
        for the database's one write lock, which another request's transaction can hold while its
        own commit waits for that same loop, and the API server (with the scheduler behind the
        lock) stands still until SQLite's busy timeout gives up."""
        wanted = set(run_ids)
        known = [after for after in (self._run_after(dag_id, r) for r in sorted(wanted)) if after is not None]
        if not known:
            return {}
        span = (min(known), max(known))
        held = self._listed(dag_id, wanted, span)
        # A wanted run listed nowhere is gone, or was made again with another run_after.
        again = [after for after in (self._run_after(dag_id, r, fresh=True) for r in sorted(wanted - set(held)))
                 if after is not None]
        if any(after < span[0] or after > span[1] for after in again):
            held = self._listed(dag_id, wanted, (min(span[0], *again), max(span[1], *again)))
        return held

    def _listed(self, dag_id: str, wanted: set[str], span: tuple[tuple[datetime, str], tuple[datetime, str]]
                ) -> dict[str, tuple[dict[str, Any], dict[ProcessorId, dict[str, Any]]]]:
        between = {"run_after_gte": span[0][1], "run_after_lte": span[1][1]}
        by_run: dict[str, list[dict[str, Any]]] = {}
        for ti in self._pages(api_path("dags", dag_id, "dagRuns", "~", "taskInstances"), "task_instances",
                              params={**between, "order_by": "id"}):
            if ti["dag_run_id"] in wanted:
                by_run.setdefault(ti["dag_run_id"], []).append(ti)
        if not by_run:
            return {}
        runs = {run["dag_run_id"]: run for run in self._pages(
            api_path("dags", dag_id, "dagRuns"), "dag_runs", params={**between, "order_by": "run_after"})
            if run["dag_run_id"] in by_run}
        return {run_id: (runs[run_id], _by_processor(tis)) for run_id, tis in by_run.items() if run_id in runs}

    def _run_after(self, dag_id: str, run_id: str, fresh: bool = False) -> tuple[datetime, str] | None:
        """The run's ``run_after``, as a time and as Airflow wrote it, read once and kept
        (``fresh``: read again); ``None`` for a run Airflow does not hold."""
        key = (dag_id, run_id)
        if fresh or key not in self._run_afters:
            run = self.find_run(dag_id, run_id)
            after = run.get("run_after") if run else None
            self._run_afters[key] = (_instant(after), after) if after else None
        return self._run_afters[key]

    def _pages(self, path: str, key: str, params: Mapping[str, Any] | None = None) -> Iterable[dict[str, Any]]:
        """Every entry of a GET listing, a page of :data:`PAGE` at a time."""
        offset = 0
        while True:
            data = self.request("GET", path, params={**(params or {}), "limit": PAGE, "offset": offset})
            yield from data[key]
            offset += len(data[key])
            if not data[key] or offset >= data["total_entries"]:
                return

    def task_instances_by_run(self, dag_id: str) -> dict[str, dict[ProcessorId, dict[str, Any]]]:
        """Every task instance of the DAG, by run id and then as :meth:`task_instances` keys
        them: one request per page of :data:`PAGE` for all runs, where one per run would ask
        again for each."""
        by_run: dict[str, list[dict[str, Any]]] = {}
        for ti in self._pages(api_path("dags", dag_id, "dagRuns", "~", "taskInstances"), "task_instances",
                              params={"order_by": "id"}):
            by_run.setdefault(ti["dag_run_id"], []).append(ti)
        return {run: _by_processor(tis) for run, tis in by_run.items()}

    def wait_for_run(
        self,
        dag_id: str,
        run_id: str,
        timeout: float = 600,
        progress: Callable[[str], None] | None = None,
    ) -> str:
        """Wait for the run to finish, reporting each task state change; returns the run's state."""
        seen: dict[str, str | None] = {}
        started = time.monotonic()

        def finished() -> bool:
            self.on_poll()
            if progress is not None:
                for task_id, ti in self.task_instances(dag_id, run_id).items():
                    if seen.get(task_id, "-") != ti["state"]:
                        seen[task_id] = ti["state"]
                        progress(f"  {time.monotonic() - started:6.1f}s  {run_id}  {task_id:<10} {ti['state']}")
            return self.dag_run(dag_id, run_id)["state"] in TERMINAL_RUN_STATES

        _wait_until(f"run {run_id} of {dag_id}", finished, timeout, interval=1.0)
        return self.dag_run(dag_id, run_id)["state"]

    def clear(self, dag_id: str, run_id: str, task_ids: list[str], dry_run: bool = False) -> list[dict[str, Any]]:
        """Clear exactly ``task_ids`` of one run (not their downstream), whatever their state; a
        partition ``task[i]`` clears that mapped task instance alone.

        Retried on a server error: a database error rolls the clear back, and clearing the same
        task instances again only resets them once more."""
        markers: list[Any] = []
        for p in map(ProcessorId.parse, task_ids):
            markers.append([p.task, p.map_index] if p.partitioned else p.task)
        body = {
            "dry_run": dry_run, "task_ids": markers, "dag_run_id": run_id, "only_failed": False,
            "include_downstream": False, "include_upstream": False, "reset_dag_runs": True,
        }
        return self.request("POST", api_path("dags", dag_id, "clearTaskInstances"), json=body,
                            idempotent=True)["task_instances"]

    def set_state(self, dag_id: str, run_id: str, task_id: str, state: str, note: str | None = None) -> None:
        """Set one task instance's state (not its upstream or downstream), with an optional note.
        An instance already in ``state`` is left as it is: Airflow answers 409 when it changed no
        instance (this call sent again after an answer it lost, or another caller's change)."""
        body: dict[str, Any] = {"new_state": state}
        if note:
            body["note"] = note[:1000]
        p = ProcessorId.parse(task_id)
        self.request("PATCH", api_path("dags", dag_id, "dagRuns", run_id, "taskInstances", p.task,
                                       *([p.map_index] if p.partitioned else [])), json=body, idempotent=True,
                     already_ok=True)

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1) -> str:
        """The log of one try of a task instance (``map_index``: one of a mapped task's), as text
        (one line per log event)."""
        data = self.request("GET", api_path("dags", dag_id, "dagRuns", run_id, "taskInstances", task_id, "logs",
                                         try_number),
                            params={"full_content": "true", "map_index": map_index},
                            headers={"Accept": "application/json"})
        content = data.get("content", []) if isinstance(data, dict) else []
        lines = []
        for e in content:  # structured events: the message, then its details (an exception's among them)
            if isinstance(e, dict):
                details = {k: v for k, v in e.items() if k not in ("event", "timestamp", "level", "logger")}
                lines.append(str(e.get("event", "")) + (" " + json.dumps(details, ensure_ascii=False) if details else ""))
            else:
                lines.append(str(e))
        return "\n".join(lines)

    def failed_task_instances(self, dag_id: str) -> list[dict[str, Any]]:
        """Every task instance of ``dag_id`` in state ``failed``, across its runs."""
        data = self.request("GET", api_path("dags", dag_id, "dagRuns", "~", "taskInstances"),
                            params={"state": "failed", "limit": 1000})
        return data["task_instances"]

    def dag_runs_at(self, dag_id: str, logical_date: datetime) -> list[str]:
        """The ids of ``dag_id``'s runs at this date: those with exactly this logical date, else
        the runs Airflow started on asset events (which have none) whose partition is at it
        (:func:`falkirk.policies.asset_events.run_date`), among the newest 1,000."""
        stamp = logical_date.isoformat()
        data = self.request("GET", api_path("dags", dag_id, "dagRuns"),
                            params={"logical_date_gte": stamp, "logical_date_lte": stamp, "limit": 10})
        if data["dag_runs"]:
            return [run["dag_run_id"] for run in data["dag_runs"]]
        # No filter on the partition: the API filters runs by logical date only.
        data = self.request("GET", api_path("dags", dag_id, "dagRuns"),
                            params={"order_by": "-run_after", "limit": 1000})
        return [run["dag_run_id"] for run in data["dag_runs"]
                if not run.get("logical_date") and partition_date_of(run) == logical_date]

    def latest_logical_date(self, dag_id: str) -> datetime | None:
        """The logical date of ``dag_id``'s latest run (``None``: no run has one); runs of
        ``airflow dags test`` do not count."""
        data = self.request("GET", api_path("dags", dag_id, "dagRuns"),
                            params={"order_by": "-logical_date", "limit": 50, "logical_date_gte": "1970-01-01T00:00:00Z"})
        from falkirk.plugins.dags_test import is_test_run

        runs = [r for r in data["dag_runs"] if r.get("logical_date") and not is_test_run(r)]
        return _instant(runs[0]["logical_date"]) if runs else None

    def run_dates(self, dag_id: str) -> list[tuple[str, datetime | None]]:
        """``dag_id``'s newest 1,000 runs, newest first, each with the date its epoch is read from
        (:func:`falkirk.policies.asset_events.run_date`); runs of ``airflow dags test`` left out."""
        from falkirk.plugins.dags_test import is_test_run

        data = self.request("GET", api_path("dags", dag_id, "dagRuns"), params={"order_by": "-run_after", "limit": 1000})
        return [(r["dag_run_id"], run_date_of(r)) for r in data["dag_runs"] if not is_test_run(r)]

    def runs_between(self, dag_id: str, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """``dag_id``'s runs at a date from ``start`` to ``end`` (each with ``dag_run_id``,
        ``state``, ``logical_date``, ``triggered_by``), oldest first: those with a logical date
        there, then the runs Airflow started on asset events (no logical date) whose partition is
        there, among the newest 1,000."""
        found: list[dict[str, Any]] = []
        while True:
            data = self.request("GET", api_path("dags", dag_id, "dagRuns"), params={
                "logical_date_gte": start.isoformat(), "logical_date_lte": end.isoformat(),
                "order_by": "logical_date", "limit": 100, "offset": len(found)})
            found += data["dag_runs"]
            if not data["dag_runs"] or len(found) >= data["total_entries"]:
                break
        data = self.request("GET", api_path("dags", dag_id, "dagRuns"),
                            params={"order_by": "-run_after", "limit": 1000})
        return found + [run for run in reversed(data["dag_runs"]) if not run.get("logical_date")
                        and (date := partition_date_of(run)) is not None and start <= date <= end]

    def delete_run(self, dag_id: str, run_id: str) -> None:
        """Delete a DAG run and its task instances."""
        response = self.http.delete(api_path("dags", dag_id, "dagRuns", run_id))
        if response.status_code not in (204, 404):  # 404: already gone (a repeated discard)
            raise AirflowError(f"DELETE /api/v2/dags/{dag_id}/dagRuns/{run_id} -> {response.status_code}: "
                               f"{response.text[:2000]}")

    def active_runs(self, dag_id: str) -> list[dict[str, Any]]:
        """``dag_id``'s queued and running DAG runs (each with ``dag_run_id``, ``state``, ``logical_date``)."""
        data = self.request("GET", api_path("dags", dag_id, "dagRuns"),
                            params=[("state", "queued"), ("state", "running"), ("limit", "1000")])
        return data["dag_runs"]

    def max_active_runs(self, dag_id: str) -> int | None:
        """The DAG's ``max_active_runs`` (``None`` when it has no limit)."""
        return self.request("GET", api_path("dags", dag_id)).get("max_active_runs")

    def queue_run(self, dag_id: str, run_id: str, note: str) -> None:
        """Set a running DAG run back to queued (its task instances keep their states)."""
        self.request("PATCH", api_path("dags", dag_id, "dagRuns", run_id), json={"state": "queued", "note": note[:1000]},
                     idempotent=True)

    def set_run_state(self, dag_id: str, run_id: str, state: str, note: str) -> None:
        """Set a DAG run's state (``success`` or ``failed``) with a note saying why."""
        self.request("PATCH", api_path("dags", dag_id, "dagRuns", run_id), json={"state": state, "note": note[:1000]},
                     idempotent=True)

    def produced_assets(self, dag_id: str, task_id: str) -> list[dict[str, Any]]:
        """The Assets ``task_id`` of ``dag_id`` names as outlets (each with ``id``, ``name``, ``uri``)."""
        data = self.request("GET", "/api/v2/assets", params={"dag_ids": dag_id, "limit": 1000})
        return [a for a in data["assets"] if any(p["dag_id"] == dag_id and p["task_id"] == task_id
                                                 for p in a.get("producing_tasks", []))]

    def asset_events(self, asset_id: int, since: datetime | None = None, newest: bool = False
                     ) -> list[dict[str, Any]]:
        """The events of one Asset stamped at ``since`` or later, oldest first; ``newest``: its
        newest 1,000, newest first."""
        params: dict[str, Any] = {"asset_id": asset_id, "order_by": "-timestamp" if newest else "timestamp",
                                  "limit": 1000}
        if since is not None:
            params["timestamp_gte"] = since.isoformat()
        return self.request("GET", "/api/v2/assets/events", params=params)["asset_events"]

    def scheduling_assets(self, dag_id: str) -> list[dict[str, Any]]:
        """The Assets ``dag_id`` is scheduled on (each with ``id``, ``name``, ``uri``)."""
        data = self.request("GET", "/api/v2/assets", params={"dag_ids": dag_id, "limit": 1000})
        return [a for a in data["assets"] if any(d["dag_id"] == dag_id for d in a.get("scheduled_dags", []))]

    def create_asset_event(self, asset_id: int, extra: Mapping[str, Any], partition_key: str | None = None
                           ) -> dict[str, Any]:
        """Emit an event of one Asset (Airflow adds ``"from_rest_api": true`` to its ``extra``) and
        start the runs scheduled on it, as a task instance's outlet event does."""
        body: dict[str, Any] = {"asset_id": asset_id, "extra": dict(extra)}
        if partition_key is not None:
            body["partition_key"] = partition_key
        return self.request("POST", "/api/v2/assets/events", json=body)

    def dag_exists(self, dag_id: str) -> bool:
        return self.http.get(api_path("dags", dag_id)).status_code == 200


def _instant(stamp: str) -> datetime:
    """An instant as Airflow's API writes it (ISO 8601, ``Z`` for UTC).

    >>> _instant("2026-01-02T00:00:00.5Z").isoformat()
    '2026-01-02T00:00:00.500000+00:00'
    """
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def run_date_of(run: Mapping[str, Any]) -> datetime | None:
    """The date a run's epoch is read from: its logical date, else its partition's.

    >>> run_date_of({"logical_date": "2026-01-02T00:00:00Z", "partition_key": None})
    datetime.datetime(2026, 1, 2, 0, 0, tzinfo=datetime.timezone.utc)
    >>> run_date_of({"logical_date": None, "partition_key": "2026-01-03T00:00:00"})
    datetime.datetime(2026, 1, 3, 0, 0, tzinfo=datetime.timezone.utc)
    """
    logical = run.get("logical_date")
    return _instant(logical) if logical else partition_date_of(run)


def partition_date_of(run: Mapping[str, Any]) -> datetime | None:
    """The date of the partition a run started on asset events runs (``None``: it has none).

    >>> partition_date_of({"partition_key": "2026-01-02T03:00:00"})
    datetime.datetime(2026, 1, 2, 3, 0, tzinfo=datetime.timezone.utc)
    >>> partition_date_of({"partition_date": None, "partition_key": None}) is None
    True
    """
    date = run.get("partition_date")
    return run_date(None, _instant(date) if date else None,
                    run.get("partition_key"))


def _by_processor(task_instances: list[dict[str, Any]]) -> dict[ProcessorId, dict[str, Any]]:
    """Task instances keyed ``task``, or ``task[i]`` for a mapped one."""
    return {ProcessorId(task=ti["task_id"], map_index=ti.get("map_index", -1)): ti for ti in task_instances}


def failed_runs(client: Any, dag_id: str, run_ids: Iterable[str]) -> dict[str, tuple[str, dict[ProcessorId, str | None]]]:
    """Of ``run_ids``, the runs Airflow holds failed, each with its task instances' states by
    processor: what :func:`falkirk.policies.planning.replay_decisions.runs_to_settle` decides on.
    ``client`` is an :class:`AirflowClient` or anything with its ``dag_run`` and ``task_instances``."""
    failed = {}
    for run in sorted(set(run_ids)):
        state = client.dag_run(dag_id, run).get("state")
        if state == "failed":
            failed[run] = (state, {t: ti.get("state") for t, ti in client.task_instances(dag_id, run).items()})
    return failed
