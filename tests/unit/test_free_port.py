"""``devstack.processes.free_port``: a port nothing listens on, never the same one twice in a
process (two services of one stack given the same port cannot both start)."""

from __future__ import annotations

import socket

import pytest

from devstack import processes


def test_a_port_the_os_gives_again_is_not_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OS may give a port just released again: free_port asks again instead."""
    given = iter([40001, 40001, 40002])

    class OsGivingAPortTwice:  # stand-in for socket.socket: the ports it gives are the test data
        def __enter__(self) -> OsGivingAPortTwice:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(given)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(processes, "_handed_out", set())
    monkeypatch.setattr(processes.socket, "socket", OsGivingAPortTwice)
    assert [processes.free_port(), processes.free_port()] == [40001, 40002]


def test_the_ports_handed_out_are_distinct_and_nothing_listens_on_them() -> None:
    ports = [processes.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
