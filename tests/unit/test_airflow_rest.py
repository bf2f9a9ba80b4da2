"""Which answers :meth:`AirflowClient.request` sends again. The server is a stand-in (a
``http.server`` in a thread answering from a script): the answers under test, a lock refusal and a
failure after the write, cannot be provoked on demand from a real Airflow."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from falkirk.plugins import airflow_rest
from falkirk.plugins.airflow_rest import AirflowClient, AirflowError

LOCKED = {"detail": "Database is locked. Backfill creation is not supported on SQLite under concurrent access."}


class ScriptedServer:
    """Answers each request with the next (status, body) of ``script`` and records the paths."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict]] = []
        self.seen: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                server.seen.append(f"{self.command} {self.path}")
                status, body = server.script.pop(0)
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    monkeypatch.setattr(airflow_rest.time, "sleep", lambda _s: None)
    s = ScriptedServer()
    yield s
    s.httpd.shutdown()


def test_a_write_refused_with_503_is_sent_again_until_it_is_carried_out(server: ScriptedServer) -> None:
    server.script = [(503, LOCKED), (503, LOCKED), (200, {"id": 7})]
    client = AirflowClient(server.url, token="t")
    assert client.request("POST", "/api/v2/backfills", json={}) == {"id": 7}
    assert server.seen == ["POST /api/v2/backfills"] * 3


def test_a_write_refused_on_every_attempt_names_the_refusal(server: ScriptedServer) -> None:
    server.script = [(503, LOCKED)] * 4
    client = AirflowClient(server.url, token="t")
    with pytest.raises(AirflowError, match=r"POST /api/v2/backfills -> 503: .*Database is locked"):
        client.request("POST", "/api/v2/backfills", json={})
    assert len(server.seen) == 4


def test_a_write_that_failed_after_it_was_taken_is_not_sent_again(server: ScriptedServer) -> None:
    server.script = [(500, {"detail": "Internal Server Error"}), (200, {"id": 8})]
    client = AirflowClient(server.url, token="t")
    with pytest.raises(AirflowError, match="-> 500"):
        client.request("POST", "/api/v2/backfills", json={})
    assert server.seen == ["POST /api/v2/backfills"]


def test_setting_a_state_an_instance_already_has_is_done_and_other_refusals_are_raised(server: ScriptedServer) -> None:
    """Airflow answers 409 when a PATCH changed no instance: the pairs' takeover, sent again after
    a lost answer or beside another takeover, found ``sessions[5]`` skipped already."""
    server.script = [(409, {"detail": "Task id sessions is already in skipped state"}),
                     (400, {"detail": "Invalid state"})]
    client = AirflowClient(server.url, token="t")
    assert client.set_state("falkirk_pairs", "epoch-3", "sessions[5]", "skipped", note="taken over") is None
    with pytest.raises(AirflowError, match="-> 400"):
        client.set_state("falkirk_pairs", "epoch-3", "sessions[5]", "bogus")
    assert server.seen == ["PATCH /api/v2/dags/falkirk_pairs/dagRuns/epoch-3/taskInstances/sessions/5"] * 2
    with pytest.raises(AirflowError, match="-> 409"):  # elsewhere a conflict is still one
        server.script = [(409, {"detail": "already exists"})]
        client.request("POST", "/api/v2/dags/d/dagRuns", json={})


def test_a_read_is_sent_again_after_a_server_error(server: ScriptedServer) -> None:
    server.script = [(500, {}), (200, {"dag_runs": []})]
    client = AirflowClient(server.url, token="t")
    assert client.request("GET", "/api/v2/dags/d/dagRuns") == {"dag_runs": []}
    assert len(server.seen) == 2


def test_a_backfill_left_behind_by_its_own_refused_creation_is_cancelled_and_created_again(
        server: ScriptedServer) -> None:
    """Airflow committed the backfill, refused (503) when its runs met a lock, and could not
    remove it: the retry meets 409, and the orphan (this call's dates and behaviour, no runs)
    would hold every retry off until the scheduler withdraws it two minutes later."""
    dates = {"from_date": "2026-01-06T00:00:00Z", "to_date": "2026-01-06T00:00:00Z", "reprocess_behavior": "failed"}
    orphan = {"id": 5, "completed_at": None, **dates}
    server.script = [(503, LOCKED), (409, {"detail": "There is already a running backfill for dag d"}),
                     (200, {"backfills": [{"id": 4, "completed_at": "2026-01-01T00:00:00Z", **dates}, orphan]}),
                     (200, {**orphan, "completed_at": "2026-01-06T00:01:00Z"}),
                     (200, {"id": 6, "completed_at": None})]
    client = AirflowClient(server.url, token="t")
    day = datetime(2026, 1, 6, tzinfo=timezone.utc)
    assert client.create_backfill("d", day, day, "failed")["id"] == 6
    assert server.seen == ["POST /api/v2/backfills", "POST /api/v2/backfills", "GET /api/v2/backfills?dag_id=d",
                           "PUT /api/v2/backfills/5/cancel", "POST /api/v2/backfills"]


def test_a_running_backfill_of_other_dates_after_a_refusal_is_someone_elses_and_raised(server: ScriptedServer) -> None:
    other = {"id": 5, "completed_at": None, "from_date": "2026-01-02T00:00:00Z", "to_date": "2026-01-03T00:00:00Z",
             "reprocess_behavior": "failed"}
    server.script = [(503, LOCKED), (409, {"detail": "There is already a running backfill for dag d"}),
                     (200, {"backfills": [other]})]
    client = AirflowClient(server.url, token="t")
    day = datetime(2026, 1, 6, tzinfo=timezone.utc)
    with pytest.raises(AirflowError, match="409: .*already a running backfill"):
        client.create_backfill("d", day, day, "failed")
    assert server.seen == ["POST /api/v2/backfills", "POST /api/v2/backfills", "GET /api/v2/backfills?dag_id=d"]


def test_a_backfill_already_running_without_a_refusal_first_is_someone_elses_and_raised(
        server: ScriptedServer) -> None:
    server.script = [(409, {"detail": "There is already a running backfill for dag d"})]
    client = AirflowClient(server.url, token="t")
    day = datetime(2026, 1, 6, tzinfo=timezone.utc)
    with pytest.raises(AirflowError, match="409: .*already a running backfill"):
        client.create_backfill("d", day, day, "failed")
    assert server.seen == ["POST /api/v2/backfills"]
