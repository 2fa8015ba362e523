"""What a build adds to build-manifest.json: target, environment, tool versions, step timings."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from g4build.builder.host import find_nvcc, nvcc_version
from g4build.builder.state import BuildState

_KEYS = ("TORCH_CUDA_ARCH_LIST", "FLASHINFER_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS", "CMAKE_BUILD_TYPE",
         "VLLM_TARGET_DEVICE", "VLLM_VERSION_OVERRIDE", "CUDA_HOME")


def _version(argv: list[str]) -> str | None:
    if not shutil.which(argv[0]):
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", out)
    return m[1] if m else None


def tool_versions() -> dict[str, str | None]:
    return {
        "python": platform.python_version(),
        "nvcc": nvcc_version(nvcc) if (nvcc := find_nvcc()) else None,
        "cmake": _version(["cmake", "--version"]),
        "ninja": _version(["ninja", "--version"]),
        "git": _version(["git", "--version"]),
        "platform": f"{sys.platform}-{platform.machine()}",
    }


def script_timings(done_dir: Path) -> dict[str, float]:
    """Step timings an emitted script left as ``<root>/.g4build-done/<step>.seconds``."""
    found: dict[str, float] = {}
    for marker in sorted(done_dir.glob("*.seconds")) if done_dir.is_dir() else ():
        try:
            found[marker.name.removesuffix(".seconds")] = float(marker.read_text(encoding="utf-8-sig").strip())
        except (OSError, ValueError):
            continue
    return found


def build_extra(*, arch: str | None, os_name: str | None, cuda: str | None, state: Path | None) -> dict[str, Any]:
    import os

    return {
        "target": {"arch": arch, "os": os_name, "cuda": cuda},
        "env": {k: os.environ[k] for k in _KEYS if k in os.environ},
        "tools": tool_versions(),
        # the native executor keeps its timings in the state file; an emitted script beside it, in .g4build-done
        "timings": {**script_timings(state.parent / ".g4build-done"), **BuildState.load(state).timings()}
        if state else {},
    }
