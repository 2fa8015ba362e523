"""`g4build overlay` of a Windows fork's wheel: its Python files are the fork's, not the pin's.

The wheel is made here the way the reports name it (``vllm-0.21.0+cu132-cp312-cp312-win_amd64.whl``) from the
pin's real sdist files: every file the real series touch, with the forward-ported Windows tree's own change
(patches/windows-base/vllm-0.21.0, applied with git as the port applies it) and fork-style edits of files the
series patch. The series are the real ones, the pin's own files come from its real sdist (the default
pristine source), and the overlay runs through the real CLI, which validates before anything appears.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tests.support.trees import sdist_tree
from tests.support.wheelsfactory import build_wheel, run_g4build

import g4build
from g4build.data import patches_dir
from g4build.overlay.wheel import plan_overlay, touched_by
from g4build.pins.model import load_pins
from g4build.series.model import load_all

pytestmark = pytest.mark.network  # the pin's sdist (cached after the first run)

PIN = "vllm-0.21.0"
TAG = "cp312-cp312-win_amd64"
WORKER = "vllm/v1/worker/gpu_worker.py"
CUDA = "vllm/platforms/cuda.py"
BACKEND = "vllm/v1/attention/backend.py"
# A Windows edit two lines above the mm-prefix-fa hunk that follows it in cuda.py (inside the hunk's context, so
# zero fuzz fails; not next to the lines the series add, so a three-way merge takes both).
CUDA_OLD = "            except ImportError:\n                invalid_reasons_i = [\"ImportError\"]\n"
CUDA_NEW = ("            except (ImportError, OSError):  # Windows: a DLL that fails to load raises OSError\n"
            "                invalid_reasons_i = [\"ImportError\"]\n")
# A Windows edit of the very line mm-prefix-fa replaces in backend.py: no merge can take both.
BACKEND_OLD = "        if use_mm_prefix and not cls.supports_mm_prefix():\n"
BACKEND_NEW = "        if use_mm_prefix and not (cls.supports_mm_prefix() and sys.platform != \"win32\"):\n"


def _edit(text: bytes, old: str, new: str) -> bytes:
    assert text.count(old.encode()) >= 1, old
    return text.replace(old.encode(), new.encode(), 1)


def _forked_worker(pristine: Path, work: Path) -> bytes:
    """gpu_worker.py as the Windows base has it: the pin's file with the windows-base fixup (gloo) applied."""
    work.mkdir(parents=True)
    (work / "vllm/v1/worker").mkdir(parents=True)
    (work / WORKER).write_bytes((pristine / WORKER).read_bytes())
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    fixup = patches_dir() / "windows-base" / PIN / "0002-gloo-where-torch-has-no-nccl.patch"
    subprocess.run(["git", "apply", str(fixup)], cwd=work, check=True)
    return (work / WORKER).read_bytes()


def fork_wheel(out: Path, scratch: Path, *, overlapping: bool) -> Path:
    pristine = sdist_tree(PIN)
    plan = plan_overlay(load_pins().get(PIN), load_all())
    files: dict[str, str | bytes] = {rel: (pristine / rel).read_bytes() for rel in sorted(touched_by(plan))
                                     if (pristine / rel).is_file()}
    files["vllm/__init__.py"] = (pristine / "vllm/__init__.py").read_bytes()
    files[WORKER] = _forked_worker(pristine, scratch)
    files[CUDA] = _edit((pristine / CUDA).read_bytes(), CUDA_OLD, CUDA_NEW)
    if overlapping:
        files[BACKEND] = _edit((pristine / BACKEND).read_bytes(), BACKEND_OLD, BACKEND_NEW)
    return build_wheel(out, files, version="0.21.0+cu132", tag=TAG)


def test_fork_change_beside_a_hunk_is_merged_and_checked(tmp_path: Path) -> None:
    src = fork_wheel(tmp_path / "in", tmp_path / "w", overlapping=False)
    assert src.name == "vllm-0.21.0+cu132-cp312-cp312-win_amd64.whl"
    done = run_g4build("overlay", str(src), "--pin", PIN, "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    how = {f["path"]: f["how"] for f in out["files"]}
    assert how.pop(CUDA) == "merged"
    assert set(how.values()) == {"applied"} and BACKEND in how  # every other file takes the hunks as they are
    assert out["validation"]["ok"] is True
    wheel = Path(out["wheel"])
    assert wheel.name.startswith("vllm-0.21.0+cu132.g4.") and wheel.name.endswith(f"-{TAG}.whl")
    with zipfile.ZipFile(wheel) as zf, zipfile.ZipFile(src) as before:
        merged = zf.read(CUDA).decode()
        assert CUDA_NEW in merged  # the fork's change kept
        assert "mm-prefix by recompute only when selected explicitly" in merged  # the series' change (fingerprint)
        assert zf.read(WORKER) == before.read(WORKER)  # a fork file the series leave alone is copied as it is
        assert b"is_nccl_available()" in zf.read(WORKER)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["build-manifest.json", wheel.name]


def test_fork_change_on_a_hunks_line_is_refused_naming_the_file(tmp_path: Path) -> None:
    src = fork_wheel(tmp_path / "in", tmp_path / "w", overlapping=True)
    (tmp_path / "out").mkdir()
    done = run_g4build("overlay", str(src), "--pin", PIN, "--out", str(tmp_path / "out"))
    assert done.returncode == 8, done.stderr
    err = " ".join(done.stderr.split())
    assert "patch mm-prefix-fa/vllm-0.21.0/0001-flash-attn-exact-mm-prefix.patch does not apply to" in err
    assert ("1 file(s) of vllm-0.21.0+cu132-cp312-cp312-win_amd64.whl are left (nothing was written): "
            f"{BACKEND}: mm-prefix-fa/vllm-0.21.0/0001-flash-attn-exact-mm-prefix.patch does not apply with zero "
            "fuzz; a three-way merge with vllm-0.21.0's own file conflicts: 1 conflicting hunk(s)") in err
    assert f"{CUDA}:" not in err.split("are left")[1]  # the file that merges is not named as left
    assert list((tmp_path / "out").iterdir()) == []


def test_the_overlay_route_named_for_a_pin_without_a_windows_base_runs_as_written(tmp_path: Path) -> None:
    """vllm-0.26.0 has no Windows base (the fork's 0.26.0 release commit is not pinned): `wheel --os windows`
    names the overlay of the fork's wheel as a route that works. That command, copied from the message and run
    beside a fork-style 0.26.0 wheel, overlays the 0.26.0 series and validates."""
    pin = "vllm-0.26.0"
    refused = run_g4build("wheel", "--arch", "sm120", "--os", "windows", "--pin", pin, "--dry-run")
    assert refused.returncode == 2
    [route] = [r for r in re.findall(r"`(g4build overlay [^`]+)`", " ".join(refused.stderr.split()))]
    pristine = sdist_tree(pin)
    files: dict[str, str | bytes] = {rel: (pristine / rel).read_bytes()
                                     for rel in sorted(touched_by(plan_overlay(load_pins().get(pin), load_all())))
                                     if (pristine / rel).is_file()}
    files["vllm/__init__.py"] = (pristine / "vllm/__init__.py").read_bytes()
    files[CUDA] = _edit((pristine / CUDA).read_bytes(), CUDA_OLD, CUDA_NEW)  # a Windows edit beside a hunk
    files[WORKER] = _edit((pristine / WORKER).read_bytes(), "import os\n", "import os\nimport sys  # fork\n")
    wheel_name = shlex.split(route)[2]
    src = build_wheel(tmp_path, files, version="0.26.0+cu132", tag=TAG)
    assert src.name == wheel_name
    done = subprocess.run([sys.executable, "-m", "g4build", *shlex.split(route)[1:], "--out", "out", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(Path(g4build.__file__).resolve().parents[1])})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["validation"]["ok"] is True
    assert {f["path"]: f["how"] for f in out["files"]}[CUDA] == "merged"
    with zipfile.ZipFile(tmp_path / out["wheel"]) as zf:
        assert CUDA_NEW in zf.read(CUDA).decode() and b"import sys  # fork" in zf.read(WORKER)
