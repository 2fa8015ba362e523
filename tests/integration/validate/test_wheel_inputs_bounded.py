"""A `*.whl` that is no regular file, or is larger than a wheel may be, is refused before anything reads it
(hostile input, round 3): validate and overlay of a FIFO do not wait for a writer, a link to /dev/zero is not
read without end, and each says what it found, with an exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.hangs import within
from tests.support.wheelsfactory import build_wheel

import g4build
from g4build.errors import ValidationError
from g4build.index.pages import SiteOptions
from g4build.index.site import build_index

NAME = "vllm-0.21.0-cp38-abi3-manylinux_2_24_x86_64.whl"
posix_only = pytest.mark.skipif(os.name != "posix", reason="FIFOs and /dev/zero: POSIX")


def _g4(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess that may not take long: a hang is a failure, not a stuck test run."""
    toolkit = str(Path(g4build.__file__).resolve().parents[1])
    full = {**os.environ, **(env or {}), "COLUMNS": "200"}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (toolkit, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "g4build", *args], capture_output=True, text=True, env=full,
                          check=False, timeout=60)


def _special(folder: Path, kind: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / NAME
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return path


FOUND = {"fifo": "found a named pipe (FIFO)", "dev-zero": "found a character device"}


@posix_only
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_validate_refuses_a_special_file(tmp_path: Path, kind: str) -> None:
    done = _g4("validate", str(_special(tmp_path, kind)))
    assert done.returncode == 10, done.stderr
    assert FOUND[kind] in done.stdout + done.stderr and "unexpected" not in done.stderr


@posix_only
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_overlay_refuses_a_special_file(tmp_path: Path, kind: str) -> None:
    done = _g4("overlay", str(_special(tmp_path / "in", kind)), "--pin", "vllm-0.21.0", "--out", str(tmp_path / "out"))
    assert done.returncode == 10, done.stderr
    assert FOUND[kind] in done.stderr and "unexpected" not in done.stderr
    assert not any((tmp_path / "out").glob("*.whl"))


@posix_only
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_index_build_refuses_a_special_file(tmp_path: Path, kind: str) -> None:
    special = _special(tmp_path / "w", kind)
    with pytest.raises(ValidationError, match=FOUND[kind].replace("(", r"\(").replace(")", r"\)")):
        within(lambda: build_index(tmp_path / "w", tmp_path / "site", SiteOptions()), fifos=[special])
    assert not (tmp_path / "site").exists()


def test_a_wheel_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "in")
    assert wheel.name == NAME
    small = {"G4BUILD_MAX_WHEEL_BYTES": "1000"}
    done = _g4("validate", str(wheel), env=small)
    assert done.returncode == 10 and "more than the 1000 a wheel may be" in done.stdout + done.stderr, done.stderr
    done = _g4("overlay", str(wheel), "--pin", "vllm-0.21.0", "--out", str(tmp_path / "out"), env=small)
    assert done.returncode == 10 and "more than the 1000 a wheel may be" in done.stderr, done.stderr
    assert _g4("validate", str(wheel)).returncode == 0  # under the default limit it is read
