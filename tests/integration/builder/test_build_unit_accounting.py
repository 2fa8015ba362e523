"""The vllm-kernel-archs unit accounting (units-sm120.yaml) against the real sm_120 build of vLLM 0.21.0: the
series applied to the pin's sdist, vLLM's own extension CMake run for 12.0f per kernel profile (as
test_build_kernel_profile does), and FlashAttention 2's units from a real CMake configure of the patched
vllm-flash-attn (its harness, nvcc as CUDA compiler). Every unit either profile compiles is in exactly one
group of its profile, and every glob names a unit; QuTLASS's sm100 units (0004) are gone where it targets 12.x
and kept where it targets 10.x. The gemma4 list is the 117 units a 16-core device build of `--kernels gemma4`
compiled (its .ninja_log: 94 vLLM units and 23 FlashAttention 2 ones)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.support.cmake import find_cmake

from g4build.builder.depapply import apply_build_series
from g4build.builder.kernels import GEMMA4_FA2_HEAD_DIMS
from g4build.builder.units import units_from_ninja
from g4build.pins.model import load_pins
from g4build.series.deps import get_build_series
from g4build.series.unitaccount import Accounting, check, load_accounting

pytestmark = [pytest.mark.network, pytest.mark.nvcc, pytest.mark.cmake]  # the pin's sdist; FA2's real configure
CMAKE = find_cmake()
PIN = "vllm-0.21.0"
QUTLASS_SM100 = {"qutlass/qutlass/csrc/fused_quantize_mx_sm100.cu", "qutlass/qutlass/csrc/fused_quantize_nv_sm100.cu"}
need_tools = pytest.mark.skipif(CMAKE is None or shutil.which("nvcc") is None or shutil.which("ninja") is None,
                                reason="needs CMake >= 3.26, nvcc and ninja")


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.trees import sdist_tree
    from tests.support.vllm_cmake import evaluation_tree

    tree = evaluation_tree(sdist_tree(PIN), tmp_path_factory.mktemp("units") / "patched")
    _git("init", "-q", cwd=tree)
    _git("add", "-A", cwd=tree)
    _git("commit", "-qm", "upstream vllm 0.21.0 (CMake and csrc)", cwd=tree)
    apply_build_series(tree, get_build_series("vllm-kernel-archs"), load_pins().get(PIN))
    return tree


Unit = tuple[str, str]  # (target, source): cuda_utils_kernels.cu and common.cpp are units of two targets


def _vllm_units(tree: Path, archs: str, profile: str, work: Path) -> set[Unit]:
    from tests.support.vllm_cmake import evaluate

    ev = evaluate(tree, archs, work, profile, cmake=CMAKE or "cmake")
    return {(t, s) for t in ev.sources for s in ev.units(t)}


def _paths(units: set[Unit]) -> set[str]:
    return {s for _, s in units}


def _fa2_units(work: Path, head_dims: str) -> set[Unit]:
    """FlashAttention 2's compile units for 12.0f as the patched vllm-flash-attn's own CMake configures them."""
    import importlib

    fa = importlib.import_module("tests.integration.builder.test_build_fa_archs_cmake")
    from tests.support.trees import sdist_tree

    text = (sdist_tree(PIN) / "CMakeLists.txt").read_text(encoding="utf-8")
    supported = fa._SUPPORTED.search(text)
    assert supported is not None
    _, ninja = fa.configure(work, "12.0f", patched=True, fa2_head_dims=head_dims,
                            vllm_cmake=(sdist_tree(PIN) / "cmake" / "utils.cmake", supported[1]))
    found = set()
    for u in units_from_ninja(ninja):
        if u.target == "_vllm_fa2_C":
            rel = re.search(r"(csrc/flash_attn/.*)$", u.source)
            assert rel is not None, u.source
            found.add((u.target, f"vllm-flash-attn/{rel[1]}"))
    return found


@pytest.fixture(scope="module")
def sm120_units(patched: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[Unit]]:
    """Per kernel profile, every unit an sm_120 build (12.0f) compiles: vLLM's targets and FlashAttention 2."""
    if CMAKE is None or shutil.which("nvcc") is None or shutil.which("ninja") is None:
        pytest.skip("needs CMake >= 3.26, nvcc and ninja")
    pytest.importorskip("torch")
    work = tmp_path_factory.mktemp("units-work")
    dims = ";".join(map(str, GEMMA4_FA2_HEAD_DIMS))
    return {"all": _vllm_units(patched, "12.0f", "all", work / "all") | _fa2_units(work, ""),
            "gemma4": _vllm_units(patched, "12.0f", "gemma4", work / "gemma4") | _fa2_units(work, dims)}


@pytest.fixture(scope="module")
def accounting() -> Accounting:
    found = load_accounting(get_build_series("vllm-kernel-archs"), PIN, "sm120")
    assert found is not None and found.arch_list == "12.0f"
    return found


@need_tools
def test_every_sm120_unit_is_accounted_for_and_every_glob_names_one(sm120_units: dict[str, set[Unit]],
                                                                     accounting: Accounting) -> None:
    found = check(accounting, {p: _paths(us) for p, us in sm120_units.items()})
    assert found.unaccounted == ()  # a unit upstream or a series change added, that no group says anything of
    assert found.ambiguous == () and found.wrong_profile == ()
    assert found.stale_globs == ()  # a group naming a unit the build no longer has
    assert found.ok


@need_tools
def test_the_lists_are_the_device_builds(sm120_units: dict[str, set[Unit]]) -> None:
    # gemma4: the 117 units of the 16-core device build's .ninja_log; all: 106 vLLM units (v3 compiled 108:
    # QuTLASS's two sm100 units more) and FA2's 55
    assert len(sm120_units["gemma4"]) == 117
    assert sum(t == "_vllm_fa2_C" for t, _ in sm120_units["gemma4"]) == 23
    assert len(sm120_units["all"]) == 106 + 55
    assert sm120_units["gemma4"] < sm120_units["all"]
    assert not QUTLASS_SM100 & _paths(sm120_units["all"])


@need_tools
def test_a_new_unit_or_a_dropped_one_is_caught(sm120_units: dict[str, set[Unit]], accounting: Accounting) -> None:
    """What the accounting test is for, on the real lists: a unit no group names, and a unit gone."""
    paths = {p: _paths(us) for p, us in sm120_units.items()}
    grown = {**paths, "all": paths["all"] | {"csrc/quantization/new_family/kernel.cu"}}
    assert check(accounting, grown).unaccounted == ("csrc/quantization/new_family/kernel.cu",)
    shrunk = {p: {u for u in us if "gguf" not in u} for p, us in paths.items()}
    assert check(accounting, shrunk).stale_globs == ("csrc/quantization/gguf/gguf_kernel.cu",)


@pytest.mark.skipif(CMAKE is None, reason="needs CMake >= 3.26")
def test_qutlass_sm100_units_go_only_where_qutlass_targets_12x(patched: Path, tmp_path: Path) -> None:
    from tests.support.trees import sdist_tree
    from tests.support.vllm_cmake import evaluation_tree

    upstream = evaluation_tree(sdist_tree(PIN), tmp_path / "upstream")
    assert _paths(_vllm_units(upstream, "12.0f", "all", tmp_path / "up")) >= QUTLASS_SM100  # upstream: compiled
    for archs, kept in (("12.0f", False), ("9.0a;12.0f", False), ("10.0f", True), ("10.0f;12.0f", True)):
        units = _paths(_vllm_units(patched, archs, "all", tmp_path / archs.replace(";", "+")))
        assert (units >= QUTLASS_SM100) == kept, archs
        assert "qutlass/qutlass/csrc/fused_quantize_mx.cu" in units, archs  # QuTLASS itself stays
