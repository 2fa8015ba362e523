"""A git remote that accepts the connection and then never answers (or trickles) cannot hold a fetch past
G4BUILD_GIT_DEADLINE: the fork's fetch, the pin's clone and a dependency's clone end with their errors. The remote
is a real socket on loopback that reads the request and stalls."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from g4build.errors import BuildError, SourceError, UsageError
from g4build.pins.model import FileRef, GitRef, Pin
from g4build.source.fetch import fetch_source
from g4build.source.forkport import ensure_fork_commits


@pytest.fixture
def stalling_remote() -> Iterator[str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)  # read nothing back, answer nothing: the client waits

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/fork.git"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_the_fork_fetch_ends_at_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             stalling_remote: str) -> None:
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("G4BUILD_GIT_DEADLINE", "2")
    start = time.monotonic()
    with pytest.raises(SourceError, match="G4BUILD_GIT_DEADLINE"):
        ensure_fork_commits(stalling_remote, "a" * 40, "b" * 40)
    assert time.monotonic() - start < 20


def test_the_pin_clone_ends_at_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            stalling_remote: str) -> None:
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("G4BUILD_GIT_DEADLINE", "2")
    pin = Pin(name="vllm-9.9.0", version="9.9.0", upstream=GitRef(remote=stalling_remote, commit="c" * 40),
              sdist=FileRef(file="vllm-9.9.0.tar.gz", sha256="0" * 64), torch="2.9.0", cuda="13.0",
              flashinfer="0.5.0")
    start = time.monotonic()
    with pytest.raises(SourceError):
        fetch_source(pin, "git", dest=tmp_path / "tree")
    assert time.monotonic() - start < 20
    assert not (tmp_path / "tree").exists()


def test_a_dependency_clone_ends_at_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 stalling_remote: str) -> None:
    from g4build.builder import deps

    monkeypatch.setenv("G4BUILD_GIT_DEADLINE", "2")
    (tmp_path / "repo").mkdir()
    start = time.monotonic()
    with pytest.raises(BuildError, match="G4BUILD_GIT_DEADLINE"):
        deps._git(["clone", "-q", stalling_remote, str(tmp_path / "repo" / "x")], tmp_path / "repo")
    assert time.monotonic() - start < 20


def test_a_deadline_that_is_no_number_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from g4build.util.gitsafe import network_deadline

    monkeypatch.setenv("G4BUILD_GIT_DEADLINE", "later")
    with pytest.raises(UsageError, match="G4BUILD_GIT_DEADLINE"):
        network_deadline()
