"""The vllm-flash-attn build series, judged by a real CMake configure of the dependency's own CMakeLists.txt.

The arch list travels as in a vLLM build: TORCH_CUDA_ARCH_LIST -> torch's gencode translation -> vLLM 0.21.0's
own cmake/utils.cmake and CUDA_SUPPORTED_ARCHS -> the dependency, whose own utils.cmake then takes over
(tests/fixtures/fa_arch_harness). What each FA2/FA3 unit is compiled for is read from the generated build.ninja.
Needs CMake >= 3.26 (the pip `cmake` wheel of the test extras), nvcc (CMake's CUDA language) and torch (its
CMake files, and vllm-flash-attn asks it for nvcc flags).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.cmake import find_cmake

from g4build.builder.units import units_from_ninja
from g4build.series.deps import get_build_series

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "vllm_flash_attn_f5bc33c"
HARNESS = REPO / "tests" / "fixtures" / "fa_arch_harness"
# vLLM 0.21.0's CMakeLists.txt, CUDA >= 13.0 branch
_SUPPORTED = re.compile(r'VERSION_GREATER_EQUAL 13\.0\)\s*\n(?:\s*#[^\n]*\n)*\s*set\(CUDA_SUPPORTED_ARCHS "([^"]+)"\)')

pytestmark = [pytest.mark.nvcc, pytest.mark.cmake, pytest.mark.network]  # the pin's sdist (cached after once)


CMAKE = find_cmake()
HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def vllm_cmake() -> tuple[Path, str]:
    from tests.support.trees import sdist_tree

    tree = sdist_tree("vllm-0.21.0")
    m = _SUPPORTED.search((tree / "CMakeLists.txt").read_text(encoding="utf-8"))
    assert m, "vLLM 0.21.0's CMakeLists.txt changed shape: no CUDA >= 13.0 CUDA_SUPPORTED_ARCHS"
    return tree / "cmake" / "utils.cmake", m[1]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _TREES.clear()
    return tmp_path_factory.mktemp("fa-archs")


def _fa_tree(dest: Path, *, patched: bool) -> Path:
    shutil.copytree(FIXTURE, dest)
    for rel in (FIXTURE / "sources.txt").read_text(encoding="utf-8").split():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).touch()
    if patched:
        for p in get_build_series("vllm-flash-attn").series.patches_for("vllm-0.21.0"):
            subprocess.run(["git", "apply", "--check", "-C3", str(p.path)], cwd=dest, check=True)  # zero fuzz
            subprocess.run(["git", "apply", str(p.path)], cwd=dest, check=True)
    return dest


_TREES: dict[bool, Path] = {}


def configure(tmp: Path, arch_list: str, *, patched: bool, vllm_cmake: tuple[Path, str],
              flash_attn: str = "", fa2_head_dims: str = "") -> tuple[str, str]:
    """Configure the harness around a (patched) vllm-flash-attn tree; returns (output, build.ninja). One build
    folder per tree is configured again for each list (CMake detects the CUDA compiler once, which is slow)."""
    assert CMAKE is not None
    import torch.utils

    if patched not in _TREES:
        _TREES[patched] = _fa_tree(tmp / ("fa-patched" if patched else "fa-upstream"), patched=patched)
    fa = _TREES[patched]
    build = fa.with_name(fa.name + "-build")
    utils, supported = vllm_cmake
    proc = subprocess.run(
        [CMAKE, "-S", str(HARNESS), "-B", str(build), "-G", "Ninja",
         f"-DTORCH_CMAKE_DIR={torch.utils.cmake_prefix_path}", f"-DVLLM_UTILS={utils}",
         f"-DVLLM_CUDA_SUPPORTED_ARCHS={supported}", f"-DFA_SRC_DIR={fa}", f"-DPython_EXECUTABLE={sys.executable}",
         f"-DG4B_FLASH_ATTN={flash_attn}", f"-DG4B_FA2_HEADDIMS={fa2_head_dims}"],  # given every time: the
        # build folder's cache keeps them
        capture_output=True, text=True, check=False, env={**os.environ, "TORCH_CUDA_ARCH_LIST": arch_list},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, (build / "build.ninja").read_text(encoding="utf-8")


def codes_of(ninja: str, target: str) -> set[tuple[str, ...]]:
    return {u.codes for u in units_from_ninja(ninja) if u.target == target and u.language == "CUDA"}


need_tools = pytest.mark.skipif(CMAKE is None or shutil.which("nvcc") is None or shutil.which("ninja") is None
                                or not HAVE_TORCH,
                                reason="needs CMake >= 3.26 (pip install cmake), nvcc, ninja and torch")


# The default arch list (12.0f) in every run; the others, a CMake configure of 1-3 minutes each, nightly (heavy).
@need_tools
@pytest.mark.parametrize(("arch_list", "fa2", "fa3"), [
    ("12.0f", ("sm_120",), None),
    pytest.param("12.0", ("sm_120",), None, marks=pytest.mark.heavy),
    pytest.param("9.0a;12.0f", ("sm_120", "sm_90"), ("sm_90a",), marks=pytest.mark.heavy),
    pytest.param("8.0;8.6;8.9;9.0;10.0;12.0+PTX", ("compute_80", "sm_80", "sm_90", "sm_100", "sm_120"), ("sm_90a",),
                 marks=pytest.mark.heavy),
])
def test_patched_fa2_gets_the_requested_archs_and_fa3_needs_hopper(
        work: Path, vllm_cmake: tuple[Path, str], arch_list: str, fa2: tuple[str, ...],
        fa3: tuple[str, ...] | None) -> None:
    out, ninja = configure(work, arch_list, patched=True, vllm_cmake=vllm_cmake)
    fa2_units = [u for u in units_from_ninja(ninja) if u.target == "_vllm_fa2_C" and u.language == "CUDA"]
    assert len(fa2_units) == len((FIXTURE / "sources.txt").read_text().split("csrc/flash_attn/src/flash_fwd_")) - 1
    assert {frozenset(u.codes) for u in fa2_units} == {frozenset(fa2)}
    fa3_units = [u for u in units_from_ninja(ninja) if u.target == "_vllm_fa3_C"]
    if fa3 is None:
        assert fa3_units == []  # not one Hopper unit compiled
        assert "FA3 is disabled: no Hopper arch (9.0a)" in out
        assert re.search(r"^build _vllm_fa3_C: phony", ninja, re.MULTILINE)  # the empty target setup.py asks for
    else:
        assert {frozenset(u.codes) for u in fa3_units if u.language == "CUDA"} == {frozenset(fa3)}


@need_tools
@pytest.mark.parametrize("arch_list", ["9.0a", "9.0a;12.0f"])
def test_flash_attn_2_alone_leaves_fa3_out_with_a_hopper_arch(work: Path, vllm_cmake: tuple[Path, str],
                                                               arch_list: str) -> None:
    """The plan's --flash-attn 2 (G4B_FLASH_ATTN=2): FA2 for the list, no FA3 unit even for 9.0a, the empty
    target setup.py asks for; without it the same list compiles FA3 (the test above)."""
    out, ninja = configure(work, arch_list, patched=True, vllm_cmake=vllm_cmake, flash_attn="2")
    assert "FA3 is disabled: G4B_FLASH_ATTN=2" in out
    assert [u for u in units_from_ninja(ninja) if u.target == "_vllm_fa3_C"] == []
    assert re.search(r"^build _vllm_fa3_C: phony", ninja, re.MULTILINE)
    assert "sm_90" in set().union(*codes_of(ninja, "_vllm_fa2_C"))


@need_tools
def test_fa2_head_dims_compile_only_those_and_tell_the_dispatch(work: Path, vllm_cmake: tuple[Path, str]) -> None:
    """--kernels gemma4 passes G4B_FA2_HEADDIMS=128;256: FA2's forward units for those head dims (8 each: fp16 and
    bf16, causal or not, split or not) and the 4 sparse hdim-128 ones, 20 of 52; the dispatch learns which."""
    out, ninja = configure(work, "12.0f", patched=True, vllm_cmake=vllm_cmake, fa2_head_dims="128;256")
    assert "FA2 head dims: 128;256 (G4B_FA2_HEADDIMS)" in out
    units = [u for u in units_from_ninja(ninja) if u.target == "_vllm_fa2_C" and u.language == "CUDA"]
    dims = sorted({int(m[1]) for u in units if (m := re.search(r"hdim(\d+)_", Path(u.source).name))})
    assert len(units) == 20 and dims == [128, 256]
    assert sum("flash_fwd_sparse_" in u.source for u in units) == 4
    api = re.search(r"^build \S*flash_api\.cpp\.o:.*?(?=^build )", ninja, re.MULTILINE | re.DOTALL)
    assert api is not None and all(f"-D{d}" in api[0] for d in ("G4B_FA2_HEADDIMS_ONLY", "G4B_FA2_HEADDIM_128",
                                                              "G4B_FA2_HEADDIM_256"))
    assert "-DG4B_FA2_HEADDIM_64" not in api[0]
    _, every = configure(work, "12.0f", patched=True, vllm_cmake=vllm_cmake)  # unset again: all 52, no define
    assert len([u for u in units_from_ninja(every) if u.target == "_vllm_fa2_C" and u.language == "CUDA"]) == 52
    assert "G4B_FA2_HEADDIMS_ONLY" not in every


@need_tools
def test_upstream_fa2_is_sm80_ptx_only_and_fa3_builds_without_hopper(work: Path,
                                                                      vllm_cmake: tuple[Path, str]) -> None:
    """What the series fixes, shown on the unpatched text (the tests above fail without the patch)."""
    _, ninja = configure(work, "12.0f", patched=False, vllm_cmake=vllm_cmake)
    assert {frozenset(c) for c in codes_of(ninja, "_vllm_fa2_C")} == {frozenset({"sm_80", "compute_80"})}
    fa3 = [u for u in units_from_ninja(ninja) if u.target == "_vllm_fa3_C" and u.language == "CUDA"]
    assert len(fa3) > 100 and all(not u.codes for u in fa3)  # compiled, for no GPU arch of the list
