"""Compile units read from build.ninja text (the shape CMake 4 writes; real configures are read in
tests/integration/builder/test_build_fa_archs_cmake.py) and the compile-work arithmetic of the benchmark."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.bench_wheel_compile_work import compile_work, family_of, proxy_items

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
