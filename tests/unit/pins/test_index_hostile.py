"""Downloads from hostile or broken servers (a real http.server on loopback): a stream without Content-Length
that drops, a trickle, a complete wrong body; and a corrupted file planted in the download cache."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.support.wheelsfactory import run_g4build

from g4build.errors import DownloadError, IntegrityError, UsageError
from g4build.pins import index

NAME = "thing-1.0.tar.gz"
BODY = bytes(range(256)) * 40  # 10 KiB
SHA = hashlib.sha256(BODY).hexdigest()


@dataclass
class Hostile:
    """What the server does for each request of the file, in order (the last mode repeats)."""

    modes: list[str]
    body: bytes = BODY
    publish_size: bool = False
    url: str = ""
    hits: Counter[str] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)

    def mode(self) -> str:
        n = self.hits["file"]
        return self.modes[min(n - 1, len(self.modes) - 1)]


def _handler(srv: Hostile) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.startswith("/simple/"):
                entry: dict[str, object] = {"filename": NAME, "url": f"/files/{NAME}", "hashes": {"sha256": SHA}}
                if srv.publish_size:
                    entry["size"] = len(BODY)
                page = json.dumps({"meta": {"api-version": "1.1"}, "files": [entry]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return
            if self.path != f"/files/{NAME}":
                self.send_response(404)
                self.end_headers()
                return
            srv.hits["file"] += 1
            mode = srv.mode()
            self.send_response(200)
            if mode in ("whole", "trickle"):
                self.send_header("Content-Length", str(len(srv.body)))
            elif mode == "badlen-whole":
                self.send_header("Content-Length", "many")
            self.end_headers()  # HTTP/1.0: without Content-Length the body ends where the connection closes
            if mode == "nolen-drop":
                self.wfile.write(srv.body[: len(srv.body) // 2])
            elif mode == "trickle":  # one byte every 5 ms: 50 s for the whole body, each read answered at once
                for i in range(len(srv.body)):
                    if srv.stop.is_set():
                        return
                    try:
                        self.wfile.write(srv.body[i:i + 1])
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(0.005)
            else:
                self.wfile.write(srv.body)

    return Handler


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Hostile]]:
    """Start a Hostile server per call; PIP_INDEX_URL points at the latest (never at a real index)."""
    servers: list[tuple[http.server.ThreadingHTTPServer, Hostile]] = []
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")

    def start(**kwargs: Any) -> Hostile:
        srv = Hostile(**kwargs)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(srv))
        srv.url = f"http://127.0.0.1:{server.server_address[1]}/simple"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append((server, srv))
        monkeypatch.setenv("PIP_INDEX_URL", srv.url)
        return srv

    yield start
    for server, srv in servers:
        srv.stop.set()
        server.shutdown()
        server.server_close()


def _no_download(cache: Path) -> bool:
    """Neither the file nor a part of it was left (the entry's lock file may stay)."""
    return not (cache / NAME).exists() and not (cache / (NAME + ".part")).exists()


@pytest.mark.parametrize("publish_size", [False, True])
def test_a_stream_without_length_that_drops_is_retried_not_called_tampering(
    tmp_path: Path, serve: Callable[..., Hostile], publish_size: bool,
) -> None:
    srv = serve(modes=["nolen-drop", "nolen-whole"], publish_size=publish_size)
    got = index.fetch_verified("thing", NAME, SHA, cache_dir=tmp_path / "cache")
    assert got.path.read_bytes() == BODY and srv.hits["file"] == 2


def test_a_stream_without_length_that_always_drops_is_a_download_error(
    tmp_path: Path, serve: Callable[..., Hostile],
) -> None:
    srv = serve(modes=["nolen-drop"], publish_size=True)
    with pytest.raises(DownloadError, match=f"ended after {len(BODY) // 2} of {len(BODY)} bytes"):
        index.fetch_verified("thing", NAME, SHA, cache_dir=tmp_path / "cache")
    assert srv.hits["file"] == index.DOWNLOAD_ATTEMPTS and _no_download(tmp_path / "cache")


def test_a_trickle_is_stopped_by_the_deadline(
    tmp_path: Path, serve: Callable[..., Hostile], monkeypatch: pytest.MonkeyPatch,
) -> None:
    serve(modes=["trickle"])
    monkeypatch.setenv("G4BUILD_DOWNLOAD_DEADLINE", "0.3")
    with pytest.raises(DownloadError, match=r"did not finish within 0\.3 s \(G4BUILD_DOWNLOAD_DEADLINE\)"):
        index.fetch_verified("thing", NAME, SHA, cache_dir=tmp_path / "cache")
    assert _no_download(tmp_path / "cache")


def test_a_trickle_below_the_minimum_rate_is_retried_then_refused(
    tmp_path: Path, serve: Callable[..., Hostile],
) -> None:
    srv = serve(modes=["trickle"])
    dest = tmp_path / NAME
    limits = index.Limits(deadline_s=600, min_rate=1e6, rate_window_s=0.2)
    with pytest.raises(DownloadError, match=r"failed 2 time\(s\), last: .*below the minimum of 1e\+06 bytes/s"):
        index.download(f"{srv.url.rsplit('/', 1)[0]}/files/{NAME}", dest, SHA, attempts=2, limits=limits)
    assert srv.hits["file"] == 2 and not dest.exists() and not dest.with_name(NAME + ".part").exists()


@pytest.mark.parametrize("value", ["fast", "-1", "inf"])
def test_bad_limits_in_the_environment_are_usage_errors(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("G4BUILD_MIN_RATE", value)
    with pytest.raises(UsageError, match="G4BUILD_MIN_RATE: expected a positive number of bytes per second, "
                                         f"or 0 for no minimum, found '{value}'"):
        index.Limits.from_env()
    monkeypatch.delenv("G4BUILD_MIN_RATE")
    monkeypatch.setenv("G4BUILD_DOWNLOAD_DEADLINE", "0")  # a deadline has no "off"
    with pytest.raises(UsageError, match="G4BUILD_DOWNLOAD_DEADLINE: expected a positive number of seconds, "
                                         "found '0'"):
        index.Limits.from_env()


def test_a_minimum_rate_of_zero_switches_the_floor_off(
    tmp_path: Path, serve: Callable[..., Hostile], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trickle (~200 bytes/s) that the default floor would stop at every window's end arrives whole."""
    short = BODY[:120]  # one byte every 5 ms: ~0.6 s
    srv = serve(modes=["trickle"], body=short)
    url = f"{srv.url.rsplit('/', 1)[0]}/files/{NAME}"
    monkeypatch.setenv("G4BUILD_MIN_RATE", "0")
    limits = dataclasses.replace(index.Limits.from_env(), rate_window_s=0.05)
    assert limits.min_rate == 0
    dest = tmp_path / NAME
    index.download(url, dest, hashlib.sha256(short).hexdigest(), attempts=1, limits=limits)
    assert dest.read_bytes() == short and srv.hits["file"] == 1
    # the control: the same trickle with the default floor is stopped; 600 bytes (~3 s), so that a client thread
    # held up for a moment does not find the whole body buffered and read it at once
    monkeypatch.delenv("G4BUILD_MIN_RATE")
    longer = BODY[:600]
    slow = serve(modes=["trickle"], body=longer)
    again = f"{slow.url.rsplit('/', 1)[0]}/files/{NAME}"
    with pytest.raises(DownloadError, match="below the minimum of 1024 bytes/s"):
        index.download(again, tmp_path / "again", hashlib.sha256(longer).hexdigest(), attempts=1,
                       limits=dataclasses.replace(index.Limits.from_env(), rate_window_s=0.05))


@pytest.mark.parametrize("below", ["", "sub/cache"])
def test_a_cache_at_or_under_a_file_is_a_usage_error_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, below: str,
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    value = str(afile / below) if below else str(afile)
    monkeypatch.setenv("G4BUILD_CACHE", value)
    with pytest.raises(UsageError, match=f"G4BUILD_CACHE={value}: expected a folder for g4build's cache"):
        index.cache_root()
    # the real command: a usage error naming the variable, not an unexpected NotADirectoryError
    done = run_g4build("overlay", "--pin", "vllm-0.21.0", "--out", str(tmp_path / "out"),
                       env={"G4BUILD_CACHE": value, "PIP_INDEX_URL": "http://127.0.0.1:9/simple"})
    said = " ".join(done.stderr.split())
    assert done.returncode == UsageError.exit_code, done.stderr
    assert f"G4BUILD_CACHE={value}: expected a folder" in said and "unexpected" not in said
    assert ("found a file" if not below else f"({afile} is on the way)") in said
    assert afile.read_text() == "not a folder\n" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("mode", ["whole", "nolen-whole"])
def test_a_complete_wrong_body_is_tampering(tmp_path: Path, serve: Callable[..., Hostile], mode: str) -> None:
    srv = serve(modes=[mode], body=BODY[::-1])
    with pytest.raises(IntegrityError, match=f"sha256 mismatch for {NAME}.*a complete download of {len(BODY)} bytes"):
        index.fetch_verified("thing", NAME, SHA, cache_dir=tmp_path / "cache")
    # with Content-Length one read proves it; without, the same bytes twice do
    assert srv.hits["file"] == (1 if mode == "whole" else 2)
    assert _no_download(tmp_path / "cache")


@pytest.mark.parametrize("pinned", [True, False])
def test_a_corrupted_cache_entry_is_rehashed_and_fetched_again(
    tmp_path: Path, serve: Callable[..., Hostile], pinned: bool,
) -> None:
    cached = tmp_path / "cache" / NAME
    cached.parent.mkdir()
    cached.write_bytes(BODY[:-1] + b"X")  # same name and size, one byte changed
    srv = serve(modes=["whole"])
    got = index.fetch_verified("thing", NAME, SHA if pinned else None, cache_dir=tmp_path / "cache")
    assert got.path == cached and not got.cached and cached.read_bytes() == BODY and srv.hits["file"] == 1


def test_a_corrupted_cache_entry_is_never_used_when_the_index_fails(
    tmp_path: Path, serve: Callable[..., Hostile],
) -> None:
    cached = tmp_path / "cache" / NAME
    cached.parent.mkdir()
    cached.write_bytes(BODY[:-1] + b"X")
    serve(modes=["whole"], body=b"")  # the index is there, but the file is served empty: cut short each time
    with pytest.raises((DownloadError, IntegrityError)):
        index.fetch_verified("thing", NAME, SHA, cache_dir=tmp_path / "cache")
    assert not cached.exists()


def test_a_malformed_content_length_counts_as_none(tmp_path: Path, serve: Callable[..., Hostile]) -> None:
    """A server's garbage Content-Length is no reason for a traceback: the body is read to its end and checked."""
    serve(modes=["badlen-whole"])
    got = index.fetch_verified("thing", NAME, SHA, cache_dir=tmp_path / "cache")
    assert got.path.read_bytes() == BODY
