"""The initial cache `g4build prefetch` writes, read by a real CMake: FetchContent takes the prefetched source
and never touches the (unreachable) repository."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from g4build.builder.deps import initial_cache, parse_cmake

CMAKE = shutil.which("cmake")


@pytest.mark.skipif(CMAKE is None, reason="cmake not found")
@pytest.mark.parametrize("name", ["plain_dep", "vllm-flash-attn"])  # a hyphenated name like upstream's FA
def test_cmake_uses_the_prefetched_source(tmp_path: Path, name: str) -> None:
    assert CMAKE is not None
    project = tmp_path / "project"
    project.mkdir()
    declare = (f"FetchContent_Declare({name} GIT_REPOSITORY {(tmp_path / 'unreachable').as_uri()} "
               "GIT_TAG v9 GIT_SHALLOW TRUE)")
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.20)\nproject(t NONE)\ninclude(FetchContent)\n"
        f"{declare}\nFetchContent_MakeAvailable({name})\n"
        f'message(STATUS "dep at ${{{name.lower()}_SOURCE_DIR}}")\n'
    )
    (dep,) = parse_cmake(declare, "CMakeLists.txt")
    prefetched = tmp_path / "cache" / dep.cache_name
    prefetched.mkdir(parents=True)
    (prefetched / "CMakeLists.txt").write_text('message(STATUS "prefetched copy configured")\n')
    init = tmp_path / "deps.cmake"
    init.write_text(initial_cache([(dep, prefetched)]))
    proc = subprocess.run([CMAKE, "-C", str(init), "-S", str(project), "-B", str(tmp_path / "b")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "prefetched copy configured" in proc.stdout
    assert f"dep at {prefetched.as_posix()}" in proc.stdout
