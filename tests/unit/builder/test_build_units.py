"""Compile units read from build.ninja text (the shape CMake 4 writes; real configures are read in
tests/integration/builder/test_build_fa_archs_cmake.py) and the compile-work arithmetic of the benchmark."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.benchmarks.bench_wheel_compile_work import (
    compile_work,
    family_from,
    family_of,
    main,
    proxy_items,
    series_defines,
)

from g4build.builder.units import CompileUnit, gencode_codes, summary, units_from_ninja

# Lines as CMake's Ninja generator writes them for vllm-flash-attn (paths shortened)
NINJA = """\
build fa/CMakeFiles/_vllm_fa2_C.dir/csrc/flash_attn/src/flash_fwd_hdim128_bf16_causal_sm80.cu.o: \
CUDA_COMPILER___vllm_fa2_C_unscanned_ /t/fa/csrc/flash_attn/src/flash_fwd_hdim128_bf16_causal_sm80.cu || \
cmake_object_order_depends_target__vllm_fa2_C
  DEFINES = -DFLASHATTENTION_DISABLE_BACKWARD -DTORCH_EXTENSION_NAME=_vllm_fa2_C
  DEP_FILE = fa/CMakeFiles/_vllm_fa2_C.dir/csrc/flash_attn/src/flash_fwd_hdim128_bf16_causal_sm80.cu.o.d
  FLAGS = -std=c++17 -Xcompiler=-fPIC --use_fast_math -gencode arch=compute_80,code=sm_80 \
-gencode arch=compute_80,code=compute_80
  OBJECT_DIR = fa/CMakeFiles/_vllm_fa2_C.dir

build fa/CMakeFiles/_vllm_fa3_C.dir/hopper/flash_api.cpp.o: CXX_COMPILER___vllm_fa3_C_unscanned_ \
/t/fa/hopper/flash_api.cpp || cmake_object_order_depends_target__vllm_fa3_C
  FLAGS = -std=c++17 -fPIC

build fa/CMakeFiles/_vllm_fa3_C.dir/hopper/instantiations/flash_fwd_hdim64_bf16_paged_sm90.cu.o: \
CUDA_COMPILER___vllm_fa3_C_unscanned_ /t/fa/hopper/instantiations/flash_fwd_hdim64_bf16_paged_sm90.cu
  FLAGS = -std=c++17 -gencode arch=compute_90a,code=sm_90a

build _vllm_fa2_C.abi3.so: CUDA_MODULE_LIBRARY_LINKER___vllm_fa2_C_ fa/CMakeFiles/x.o
  LINK_FLAGS = -shared
"""


def test_units_targets_languages_and_codes() -> None:
    text = NINJA.replace("\\\n", "")  # the backslashes above only keep this file's lines short
    units = units_from_ninja(text)
    assert [(u.target, u.language, u.codes) for u in units] == [
        ("_vllm_fa2_C", "CUDA", ("compute_80", "sm_80")),
        ("_vllm_fa3_C", "CXX", ()),
        ("_vllm_fa3_C", "CUDA", ("sm_90a",)),
    ]
    assert units[0].sass == ("sm_80",) and units[0].ptx == ("compute_80",)
    s = summary(units)
    assert s["_vllm_fa3_C"] == {"units": 2, "cuda_units": 1, "codes": {"sm_90a": 1}}


def test_gencode_forms() -> None:
    assert gencode_codes('"--generate-code=arch=compute_75,code=[compute_75,sm_75]" -gencode=arch=compute_120f,'
                         'code=sm_120f -gencode arch=compute_90a,code=sm_90a') == \
        ("compute_75", "sm_75", "sm_90a", "sm_120f")


def _u(target: str, source: str, codes: tuple[str, ...], language: str = "CUDA") -> CompileUnit:
    return CompileUnit(target=target, source=source, language=language, codes=codes)


def test_compile_work_extrapolates_per_family_and_says_what_was_not_timed() -> None:
    build = Path("/b")
    fa2 = "/s/fa/csrc/flash_attn/src/flash_fwd_{}.cu"
    up = [_u("_vllm_fa2_C", fa2.format(i), ("compute_80", "sm_80")) for i in range(4)] + \
        [_u("_vllm_fa3_C", f"/s/fa/hopper/instantiations/i{i}.cu", ("sm_90a",)) for i in range(6)] + \
        [_u("_C", "/s/v/csrc/layernorm.cu", ("compute_120", "sm_75", "sm_80", "sm_120"))]
    plan = [_u("_vllm_fa2_C", fa2.format(i), ("sm_120",)) for i in range(4)] + \
        [_u("_C", "/s/v/csrc/layernorm.cu", ("sm_120f",))]
    assert family_of(up[0], build) == "_vllm_fa2_C:csrc/flash_attn/src"
    assert family_of(up[5], build) == "_vllm_fa3_C:hopper/instantiations"
    assert proxy_items(up[-1]) == 3 and proxy_items(_u("_C", "x.cpp", (), "CXX")) == 1

    def fams(units: list[CompileUnit]) -> dict[str, list[CompileUnit]]:
        out: dict[str, list[CompileUnit]] = {}
        for u in units:
            out.setdefault(family_of(u, build), []).append(u)
        return out

    times = {"_vllm_fa2_C:csrc/flash_attn/src": {"upstream": 10.0, "plan": 12.0},
             "_C:csrc": {"upstream": 30.0, "plan": 10.0}}
    work = compile_work({"upstream": fams(up), "plan": fams(plan)}, times)
    # FA3 has no time: it takes the upstream configuration's mean of sampled units, (10 + 30) / 2
    assert work["upstream"]["untimed_families"] == ["_vllm_fa3_C:hopper/instantiations"]
    assert work["upstream"]["seconds"] == 4 * 10.0 + 6 * 20.0 + 30.0
    assert work["plan"]["seconds"] == 4 * 12.0 + 10.0
    assert work["ratio_seconds"] == (40 + 120 + 30) / 58
    assert work["ratio_proxy"] == (4 + 6 + 3) / 5


def test_a_family_past_the_timeout_counts_at_the_timeout_not_at_the_mean() -> None:
    """A timed-out sample says the family took longer than the timeout; the configuration's mean (of the shorter
    families that did finish) would undercount it, and the ratio with it."""
    up = {"_C:csrc": [_u("_C", "/s/csrc/a.cu", ("sm_80",))],
          "_C:csrc/attention": [_u("_C", f"/s/csrc/attention/p{i}.cu", ("sm_80",)) for i in range(3)]}
    plan = {"_C:csrc": [_u("_C", "/s/csrc/a.cu", ("sm_120",))]}
    times = {"_C:csrc": {"upstream": 100.0, "plan": 50.0}}
    work = compile_work({"upstream": up, "plan": plan}, times, {"_C:csrc/attention": {"upstream": 400.0}})
    assert work["upstream"]["seconds"] == 100.0 + 3 * 400.0
    assert work["upstream"]["timed_out_families"] == ["_C:csrc/attention"]
    assert work["upstream"]["untimed_families"] == []
    assert work["upstream"]["families"]["_C:csrc/attention"]["timed_out"] is True
    assert compile_work({"upstream": up, "plan": plan}, times)["upstream"]["seconds"] == 100.0 + 3 * 100.0


def test_a_ninja_log_object_path_names_the_same_family_as_its_build_ninja_unit() -> None:
    unit = "flash_fwd_split_hdim128_bf16_sm80.cu"
    assert family_from("_vllm_fa2_C", f"csrc/flash_attn/src/{unit}") == \
        family_of(_u("_vllm_fa2_C", f"/w/.deps/fa/csrc/flash_attn/src/{unit}", ("sm_120",)), Path("/b"))
    assert family_from("_C", "csrc/quantization/marlin/k.cu") == "_C:csrc/quantization/marlin"


def test_the_benchmarks_plan_takes_the_series_definitions_the_build_passes() -> None:
    """The plan the benchmark configures is what `g4build wheel --arch sm120` compiles: the bare command's real
    dry-run plan carries the gemma4 profile and FA2's head dims, and only those reach the configure."""
    def plan(*extra: str) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "g4build", "wheel", "--arch", "sm120", "--os", "linux",
                              "--no-flashinfer", "--dry-run", "--json", *extra], capture_output=True, text=True,
                             check=True).stdout
        return series_defines(json.loads(out)["env"]["CMAKE_ARGS"])

    assert plan() == ["G4B_KERNEL_PROFILE=gemma4", "G4B_FA2_HEADDIMS=128;256"]
    assert plan("--kernels", "all") == []
    assert series_defines("-C /c/deps.cmake -DCMAKE_MAKE_PROGRAM=/x/ninja -DG4B_X='a b'") == ["G4B_X=a b"]


def test_configure_gives_cmake_the_plans_definitions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real CMake configure of a project that reports the two cache entries the series' CMake reads."""
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        pytest.skip("needs cmake and ninja")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(t NONE)\n"
        'message(STATUS "Building profile [${G4B_KERNEL_PROFILE}] head dims [${G4B_FA2_HEADDIMS}]")\n')
    args = ["configure", "--tree", str(tmp_path / "t"), "--build", str(tmp_path / "b"), "--arch-list", "12.0f"]
    assert main([*args, "--define", "G4B_KERNEL_PROFILE=gemma4", "--define", "G4B_FA2_HEADDIMS=128;256"]) == 0
    assert "Building profile [gemma4] head dims [128;256]" in capsys.readouterr().out
    assert main([*args[:4], str(tmp_path / "b2"), *args[5:]]) == 0
    assert "Building profile [] head dims []" in capsys.readouterr().out
