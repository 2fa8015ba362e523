"""Package index access against a real HTTP index on loopback."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
from pathlib import Path

import pytest
from tests.support.index_server import serve_index

from g4build.errors import DownloadError, IntegrityError
from g4build.pins import index

PAYLOAD = random.Random(7).randbytes(3 << 20)  # same bytes in spawned children
SHA = hashlib.sha256(PAYLOAD).hexdigest()


def test_index_url_follows_pip_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    assert index.index_url() == "http://127.0.0.1:9/simple"
    monkeypatch.delenv("PIP_INDEX_URL")
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = http://127.0.0.2:9/mirror/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    assert index.index_url() == "http://127.0.0.2:9/mirror/simple"
    conf.write_text("[global]\nindex-url = http://127.0.0.2:9/mirror/simple\n"
                    "[download]\nindex-url = http://127.0.0.3:9/dl/simple\n")
    assert index.index_url() == "http://127.0.0.3:9/dl/simple"  # pip download's own section wins
    conf.write_text("[install]\nindex-url = http://127.0.0.4:9/only-install/simple\n")
    assert index.index_url() == "http://127.0.0.4:9/only-install/simple"
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    default = index.index_url()
    assert default.startswith("https://") and default.endswith("/simple")


def test_fetch_verifies_and_reuses_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with serve_index() as idx:
        idx.add("thing-1.0.tar.gz", PAYLOAD)
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        first = index.fetch_verified("thing", "thing-1.0.tar.gz", SHA, cache_dir=tmp_path)
        second = index.fetch_verified("thing", "thing-1.0.tar.gz", SHA, cache_dir=tmp_path)
    assert (first.cached, second.cached) == (False, True)
    assert first.path.read_bytes() == PAYLOAD
    assert idx.hits["/files/thing-1.0.tar.gz"] == 1


def test_tampered_download_is_refused_and_deleted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tampered = bytearray(PAYLOAD)
    tampered[1000] ^= 0x01
    with serve_index() as idx:
        idx.add("thing-1.0.tar.gz", bytes(tampered), publish_sha256=SHA)
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        with pytest.raises(IntegrityError) as info:
            index.fetch_verified("thing", "thing-1.0.tar.gz", SHA, cache_dir=tmp_path)
    assert SHA in info.value.message and hashlib.sha256(tampered).hexdigest() in info.value.message
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_index_publishing_another_hash_stops_before_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with serve_index() as idx:
        idx.add("thing-1.0.tar.gz", PAYLOAD, publish_sha256="0" * 64)
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        with pytest.raises(IntegrityError, match="the pin expects"):
            index.fetch_verified("thing", "thing-1.0.tar.gz", SHA, cache_dir=tmp_path)
    assert idx.hits["/files/thing-1.0.tar.gz"] == 0


def test_interrupted_download_leaves_no_complete_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with serve_index() as idx:
        idx.add("thing-1.0.tar.gz", PAYLOAD)
        idx.cut_after["thing-1.0.tar.gz"] = 1 << 20
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        with pytest.raises(DownloadError, match=f"failed {index.DOWNLOAD_ATTEMPTS} time"):
            index.fetch_verified("thing", "thing-1.0.tar.gz", SHA, cache_dir=tmp_path)
        assert idx.hits["/files/thing-1.0.tar.gz"] == index.DOWNLOAD_ATTEMPTS
    assert not (tmp_path / "thing-1.0.tar.gz").exists()
    assert not (tmp_path / "thing-1.0.tar.gz.part").exists()


def test_a_stream_that_breaks_off_once_is_fetched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with serve_index() as idx:
        idx.add("thing-1.0.tar.gz", PAYLOAD)
        idx.cut_after["thing-1.0.tar.gz"] = 1 << 20  # the first response stops after 1 MiB ...
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)

        def heal(done: int, total: int | None) -> None:
            idx.cut_after.clear()  # ... later ones are whole

        got = index.fetch_verified("thing", "thing-1.0.tar.gz", SHA, cache_dir=tmp_path, progress=heal)
        assert idx.hits["/files/thing-1.0.tar.gz"] == 2
    assert not got.cached
    assert index.sha256_file(got.path) == SHA
    assert not (tmp_path / "thing-1.0.tar.gz.part").exists()


def test_missing_file_and_missing_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with serve_index() as idx:
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        with pytest.raises(DownloadError, match="is not on the package index"):
            index.fetch_verified("thing", "thing-2.0.tar.gz", SHA, cache_dir=tmp_path)


def _fetch_in_child(url: str, cache: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    os.environ["PIP_INDEX_URL"] = url
    got = index.fetch_verified("thing", "thing-1.0.tar.gz", SHA, cache_dir=Path(cache))
    queue.put(got.cached)


def test_concurrent_fetches_make_one_good_entry(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with serve_index() as idx:
        idx.add("thing-1.0.tar.gz", PAYLOAD)
        queue = ctx.Queue()
        procs = [ctx.Process(target=_fetch_in_child, args=(idx.url, str(tmp_path), queue)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0, 0]
        results = sorted([queue.get(timeout=5), queue.get(timeout=5)])
    assert results == [False, True]  # one downloaded, the other waited on the lock and reused it
    assert idx.hits["/files/thing-1.0.tar.gz"] == 1
    assert (tmp_path / "thing-1.0.tar.gz").read_bytes() == PAYLOAD
    assert not list(tmp_path.glob("*.part"))

