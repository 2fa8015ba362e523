"""Real material for the index tests: a small wheel packed by the ``wheel`` tool and stamped with a real
build-manifest.json by g4build's emit stage, and a static HTTP server on the loopback serving a site folder."""

from __future__ import annotations

import datetime as dt
import functools
import http.server
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g4build.emit.manifest import make_manifest
from g4build.emit.stamp import add_to_wheel
from g4build.pins.model import load_pins

PIN = "vllm-0.21.0"
TAG = "cp38-abi3-manylinux_2_24_x86_64"


def tiny_vllm_wheel(
    out: Path, work: Path, *, cuda: str = "13.0", note: str = "tiny", requires_python: str = ">=3.8",
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """A wheel named and versioned like one ``g4build wheel`` makes for the pin (``0.21.0+cu130.g4.<digest>``),
    its files a stand-in vllm package: packed by ``python -m wheel pack`` (which writes RECORD), then the
    manifest stamped into its dist-info by ``g4build.emit.stamp``, as a build does (``edit`` changes the manifest
    first, its digest kept)."""
    pin = load_pins().get(PIN)
    manifest = make_manifest(pin, [], route="build", created=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
                             extra={"target": {"arch": "sm120", "os": "linux", "cuda": cuda}})
    if edit is not None:
        edit(manifest)
    version = f"{pin.version}+cu{cuda.replace('.', '')}.g4.{manifest['digest']}"
    tree = work / f"vllm-{version}"
    dist = tree / f"vllm-{version}.dist-info"
    (tree / "vllm").mkdir(parents=True)
    dist.mkdir()
    (tree / "vllm" / "__init__.py").write_text(f"__version__ = {version!r}\nNOTE = {note!r}\n")
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nRequires-Python: {requires_python}\n"
        "Requires-Dist: torch==2.11.0\n\nA stand-in vLLM for the index tests.\n")
    (dist / "WHEEL").write_text(f"Wheel-Version: 1.0\nGenerator: g4build-tests\nRoot-Is-Purelib: false\nTag: {TAG}\n")
    (dist / "top_level.txt").write_text("vllm\n")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "wheel", "pack", str(tree), "-d", str(out)], check=True,
                   capture_output=True, env={**os.environ, "SOURCE_DATE_EPOCH": "1767225600"})
    (wheel,) = out.glob(f"vllm-{version.replace('-', '_')}-*.whl")
    add_to_wheel(wheel, manifest)
    return wheel


@dataclass
class Served:
    url: str = ""
    hits: Counter[str] = field(default_factory=Counter)


@contextmanager
def serve_site(site: Path) -> Iterator[Served]:
    """``site`` served as static files (folders answer with their index.html) on 127.0.0.1, every request
    path counted."""
    served = Served()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            served.hits[self.path] += 1
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(site)))
    served.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def pip(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real pip of this interpreter, ignoring the user's pip configuration and cache (only the index the
    test names is asked)."""
    return subprocess.run([sys.executable, "-m", "pip", "--isolated", "--no-cache-dir",
                           "--disable-pip-version-check", *args], cwd=cwd, capture_output=True, text=True,
                          check=False, timeout=300)
