"""An S3 endpoint that a fault drill can take down and bring back: a forwarding HTTP
front for ``moto_server``, in its own process, that refuses connections while it is down.

``moto_server`` keeps its objects in memory, so stopping its process would also lose the
store; a real S3-compatible server (MinIO, Ceph) keeps them on disk across a restart. The
front gives the drills that second behaviour: clients talk to its port, which is closed
while the server is "stopped" (connection refused, as for a stopped server) and opened
again on "restart", with every object still there. It runs as a subprocess because
delta-rs holds the GIL while it scans a table: a front in the test's own process would
stall every read the test makes.

A drill can take the server down at an exact request, with or without that request
applied: ``down_at("PUT", "/_falkirk/invalidations/_delta_log/", applied=True)`` forwards
the matching request to the store, drops its answer and closes the port: the commit
happened, and the client cannot know it. ``applied=False`` drops the request unsent.

Example::

    with MotoS3(work) as s3, S3Outage(s3.endpoint, work) as front:
        s3.create_bucket("falkirk")
        store = StoreConfig("s3://falkirk/store", str(work / "scratch"), front.storage_options())
        front.down_at("PUT", "/aggregate/state/_delta_log/", applied=True)
        ...                      # a job commits; the front trips and stays down
        front.wait_tripped()
        front.up()               # the server is back, with every object
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import httpx

from devstack.processes import Service, free_port, wait_until
from devstack.s3 import CREDENTIALS

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class S3Outage:
    """The S3 endpoint at :attr:`endpoint`, forwarding to ``target`` while up (a subprocess)."""

    def __init__(self, target: str, work_dir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.control = f"http://127.0.0.1:{free_port()}"
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.service = Service(
            "s3-outage", [sys.executable, "-m", "devstack.s3_outage", "--target", target, "--port", str(self.port),
                          "--control-port", self.control.rsplit(":", 1)[1]],
            env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])}, log_path=work_dir / "s3_outage.log")

    def start(self) -> S3Outage:
        self.service.start()
        wait_until("the S3 front", lambda: httpx.get(f"{self.control}/state", timeout=2).status_code == 200,
                   timeout=30, services=[self.service])
        return self

    def stop(self) -> None:
        self.service.stop()

    def down_at(self, method: str, contains: str, *, applied: bool) -> None:
        """Go down at the next ``method`` request whose path contains ``contains``, forwarding it
        first if ``applied`` (its answer is lost either way)."""
        self._post("down_at", {"method": method, "contains": contains, "applied": applied})

    def hang_at(self, method: str, contains: str) -> None:
        """Hang at the next ``method`` request whose path contains ``contains``: that request and
        every later one are accepted and never answered (a server that stopped responding but
        kept its port open), until :meth:`up`."""
        self._post("down_at", {"method": method, "contains": contains, "applied": False, "hang": True})

    def down(self) -> None:
        """Stop answering now: the port refuses connections."""
        self._post("down", {})

    def up(self) -> None:
        """Answer again on the same port; an armed :meth:`down_at` or :meth:`hang_at` that no
        request has tripped yet is disarmed."""
        self._post("up", {})

    def state(self) -> dict:
        """``{"up": bool, "tripped": bool, "dropped": [[method, path], ...]}`` (dropped since armed)."""
        return httpx.get(f"{self.control}/state", timeout=10).json()

    def wait_tripped(self, timeout: float = 600) -> dict:
        """Wait until an armed :meth:`down_at` has taken the server down; returns :meth:`state`."""
        deadline = time.monotonic() + timeout
        while not (state := self.state())["tripped"]:
            self.service.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the S3 front did not trip within {timeout:.0f}s: {state}")
            time.sleep(0.2)
        return state

    def storage_options(self) -> dict[str, str]:
        """What delta-rs (and ``StoreConfig``) needs to reach the store through this endpoint."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true", **CREDENTIALS}

    def _post(self, what: str, body: dict) -> None:
        httpx.post(f"{self.control}/{what}", json=body, timeout=30).raise_for_status()

    def __enter__(self) -> S3Outage:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the front's process ----------------------------------------------------------------------


class _Front:
    def __init__(self, target: str, port: int) -> None:
        self.target = urlparse(target)
        self.port = port
        self.lock = threading.Lock()
        self.server: _Server | None = None
        self.trip: dict | None = None
        self.tripped = False
        self.dropped: list[list[str]] = []
        self.stopping: threading.Thread | None = None
        self.hanging = threading.Event()

    def up(self) -> None:
        self.hanging.clear()
        with self.lock:  # an outage armed but not yet tripped ends too, or a later request trips it
            self.trip = None
        if self.stopping is not None:
            self.stopping.join()
        with self.lock:
            if self.server is None:
                self.server = _Server(("127.0.0.1", self.port), _Forward, self)
                threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        with self.lock:
            server, self.server = self.server, None
        if server is not None:
            # shutdown() waits for serve_forever, so never on a request's thread; up() waits for it.
            def close() -> None:
                server.shutdown()
                server.server_close()
            self.stopping = threading.Thread(target=close, daemon=True)
            self.stopping.start()

    def arm(self, method: str, contains: str, applied: bool, hang: bool = False) -> None:
        with self.lock:
            self.trip = {"method": method.upper(), "contains": contains, "applied": bool(applied), "hang": hang}
            self.tripped, self.dropped = False, []

    def take_trip(self, method: str, path: str) -> dict | None:
        with self.lock:
            trip = self.trip
            if trip is not None and method == trip["method"] and trip["contains"] in path:
                self.trip = None
                return trip
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], handler: type, front: _Front) -> None:
        self.front = front
        super().__init__(address, handler)


class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        pass

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reset(self) -> None:
        """Close the connection with a TCP reset, as a server that went away does."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass

    def _went_down(self) -> None:
        front = self.server.front
        front.dropped.append([self.command, self.path])
        front.down()
        front.tripped = True
        self._reset()

    def _hang(self) -> None:
        """Hold the connection without a word until the server is brought up, then reset it."""
        front = self.server.front
        front.dropped.append([self.command, self.path])
        front.hanging.set()
        front.tripped = True
        while front.hanging.is_set():
            time.sleep(0.2)
        self._reset()

    def _forward(self) -> None:
        front = self.server.front
        body = self._body()
        if self.server is not front.server:  # down, or a connection from before a restart
            return self._reset()
        if front.hanging.is_set():
            return self._hang()
        trip = front.take_trip(self.command, self.path)
        if trip is not None and trip.get("hang"):
            return self._hang()
        if trip is not None and not trip["applied"]:
            return self._went_down()
        conn = http.client.HTTPConnection(front.target.hostname or "127.0.0.1", front.target.port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
        finally:
            conn.close()
        if trip is not None:  # applied, but the answer never arrives
            return self._went_down()
        self.send_response_only(response.status, response.reason)
        for k, v in response.getheaders():
            if k.lower() not in _HOP_BY_HOP and (k.lower() != "content-length" or self.command == "HEAD"):
                self.send_header(k, v)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")  # one request per connection, as moto_server answers
        self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


class _Control(BaseHTTPRequestHandler):
    front: _Front

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def _answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        f = self.front
        self._answer({"up": f.server is not None, "tripped": f.tripped, "dropped": f.dropped})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        action = self.path.strip("/")
        if action == "down_at":
            self.front.arm(body["method"], body["contains"], body["applied"], bool(body.get("hang")))
        elif action == "down":
            self.front.down()
        elif action == "up":
            self.front.up()
        else:
            self.send_error(404)
            return
        self._answer({"ok": True})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="an S3 endpoint a fault drill can take down and bring back")
    parser.add_argument("--target", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control-port", type=int, required=True)
    args = parser.parse_args(argv)
    front = _Front(args.target, args.port)
    front.up()
    control = type("Control", (_Control,), {"front": front})
    ThreadingHTTPServer(("127.0.0.1", args.control_port), control).serve_forever()


if __name__ == "__main__":
    main()
