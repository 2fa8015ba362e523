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
from g4build.builder.state import STEP_NAME, BuildState, seconds_problem
from g4build.errors import ConfigError
from g4build.util.safeload import read_regular

SECONDS_MAX_BYTES = 64  # "12345" and a line end; PowerShell may add a byte order mark
_SECONDS = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,6})?", re.ASCII)  # what bash's $SECONDS and PowerShell's [int] write

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
    """Step timings an emitted script left as ``<root>/.g4build-done/<step>.seconds``; a marker that is not one
    (a FIFO, a device, not a plain count of seconds, nan, 1e999, negative) is a ConfigError, before any manifest
    is written."""
    found: dict[str, float] = {}
    for marker in sorted(done_dir.glob("*.seconds")) if done_dir.is_dir() else ():
        name = marker.name.removesuffix(".seconds")
        hint = f"remove {marker} (or run the build script with G4BUILD_CLEAN=1)"
        raw = read_regular(marker, SECONDS_MAX_BYTES, "a step's timing")
        text = raw.decode("utf-8-sig", errors="replace").strip()
        if not STEP_NAME.fullmatch(name) or not _SECONDS.fullmatch(text):
            raise ConfigError(f"{marker}: expected a step's timing (a step name of ASCII letters, digits and . _ -; "
                              f"a whole or decimal count of seconds), found {text[:40]!r}", hint=hint)
        value = float(text)
        if (problem := seconds_problem(value)) is not None:
            raise ConfigError(f"{marker}: {problem}", hint=hint)
        found[name] = value
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
