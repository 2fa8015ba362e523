"""Finding a CMake new enough for vLLM's CMake files (3.26) for the tests that run real CMake."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path


def find_cmake(minimum: tuple[int, int] = (3, 26)) -> str | None:
    """The pip wheel's cmake when installed, else the one on PATH, if it is at least ``minimum``."""
    candidates = []
    if importlib.util.find_spec("cmake") is not None:
        import cmake

        candidates.append(str(Path(cmake.CMAKE_BIN_DIR) / "cmake"))
    if found := shutil.which("cmake"):
        candidates.append(found)
    for exe in candidates:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False).stdout
        m = re.search(r"(\d+)\.(\d+)", out)
        if m and (int(m[1]), int(m[2])) >= minimum:
            return exe
    return None
