"""An unpinned release's sdist for `patches check --release`: fetched from a real loopback index, verified against
the sha256 it publishes (and a pin's, when one names the same file), and extracted."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from tests.support.index_server import serve_index

from g4build.errors import IntegrityError
from g4build.pins.index import Fetched
from g4build.pins.model import FileRef, GitRef, Pin
from g4build.source.fetch import release_tree


def _sdist(version: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = f'__version__ = "{version}"\n'.encode()
        info = tarfile.TarInfo(f"vllm-{version}/vllm/_version.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _pin(file: str, sha256: str) -> Pin:
    return Pin(name="vllm-9.9.0", version="9.9.0",
               upstream=GitRef(remote="https://example.invalid/vllm", commit="0" * 40),
               sdist=FileRef(file=file, sha256=sha256), torch="2.9.0", cuda="13.0", flashinfer="0.5.0")


def test_release_tree_downloads_verifies_and_extracts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    body = _sdist("9.9.1")
    sha = hashlib.sha256(body).hexdigest()
    events: list[str] = []
    told: list[tuple[str, bool, bool]] = []
    workdir = [tmp_path / "one"]

    @contextmanager
    def progress(filename: str) -> Iterator[None]:
        events.append(f"download {filename}")
        yield None
        events.append("downloaded")

    def fetched(filename: str, got: Fetched) -> None:
        told.append((filename, got.cached, (workdir[0] / "src").exists()))

    with serve_index() as idx:
        idx.add("vllm-9.9.1.tar.gz", body)
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        tree, got_sha = release_tree("9.9.1", [_pin("vllm-9.9.1.tar.gz", sha)], tmp_path / "one", progress=progress,
                                     fetched=fetched)
        workdir[0] = tmp_path / "two"
        again, _ = release_tree("9.9.1", [], workdir[0], fetched=fetched)
    assert got_sha == sha and tree == tmp_path / "one" / "src" / "vllm-9.9.1"
    assert (tree / "vllm" / "_version.py").read_text() == '__version__ = "9.9.1"\n'
    assert (again / "vllm" / "_version.py").is_file()
    assert events == ["download vllm-9.9.1.tar.gz", "downloaded"]
    # told before each extraction; the second from the cache
    assert told == [("vllm-9.9.1.tar.gz", False, False), ("vllm-9.9.1.tar.gz", True, False)]
    assert idx.hits["/files/vllm-9.9.1.tar.gz"] == 1


def test_a_pin_recording_another_sha256_stops_before_extraction(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    body = _sdist("9.9.0")
    told: list[str] = []
    with serve_index() as idx:
        idx.add("vllm-9.9.0.tar.gz", body)
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        with pytest.raises(IntegrityError) as raised:
            release_tree("9.9.0", [_pin("vllm-9.9.0.tar.gz", "f" * 64)], tmp_path / "w",
                         fetched=lambda filename, got: told.append(filename))
    published = hashlib.sha256(body).hexdigest()
    assert raised.value.message == (f"vllm-9.9.0.tar.gz: the index publishes sha256 {published}, "
                                    f"pin vllm-9.9.0 records {'f' * 64}")
    assert raised.value.hint == "the pin or the mirror is wrong; check patches/pins.yaml and your index-url"
    assert told == [] and not (tmp_path / "w").exists()
