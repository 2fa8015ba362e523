"""doctor's Docker line, from the real Docker SDK failing against real (missing or silent) sockets: one clear
reason, never the SDK's nested exception text."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from g4build.builder.probe import SystemProbe
from g4build.doctor.docker import check_docker

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="unix sockets")


def _summary(monkeypatch: pytest.MonkeyPatch, host: str) -> str:
    monkeypatch.setenv("DOCKER_HOST", host)
    (finding,) = check_docker(SystemProbe(), timeout=2)
    assert finding.status == "warn"
    return finding.summary


def test_no_socket_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said = _summary(monkeypatch, f"unix://{tmp_path / 'absent.sock'}")
    assert said == ("Docker engine not reachable: no Docker engine socket or pipe here (Docker is not installed or "
                    "not started)")
    assert "(" not in said.split(": ", 1)[1].split(" (")[0]  # no "('Connection aborted.', FileNotFoundError(2" text


def test_a_socket_nobody_listens_on_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "silent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))  # bound, never listening: connect() is refused
    try:
        said = _summary(monkeypatch, f"unix://{path}")
    finally:
        server.close()
    assert said == "Docker engine not reachable: the Docker engine refused the connection (it is not running)"
