"""The kernel profiles of the vllm-kernel-archs build series (G4B_KERNEL_PROFILE, 0003-kernel-profile.patch) on
vLLM 0.21.0's real sdist: the series applied to the real tree, vLLM's own CMake (its extension section, its
utils.cmake and Marlin generators) run in script mode to list what each profile compiles for 12.0f, 9.0a and
9.0a;12.0f, held against upstream's lists and against the series' decisions table; the patched bindings
compiled with g++ against the venv's torch headers for both profiles; every op a left-out family implements
gets the "not compiled" kernel."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from g4build.builder.depapply import apply_build_series
from g4build.pins.model import load_pins
from g4build.series.deps import BuildSeries, get_build_series
from g4build.series.kernelprofile import left_out

if TYPE_CHECKING:
    from tests.support.vllm_cmake import Evaluated

pytestmark = pytest.mark.network  # the pin's sdist (cached once per machine)
CMAKE = shutil.which("cmake")
GXX = shutil.which("g++")
MLA = "csrc/attention/mla/sm100_cutlass_mla_kernel.cu"
BINDINGS = ("csrc/torch_bindings.cpp", "csrc/moe/torch_bindings.cpp", "csrc/libtorch_stable/torch_bindings.cpp")
C2X = "csrc/libtorch_stable/quantization/w8a8/cutlass/scaled_mm_c2x.cu"
QUTLASS_SM100 = {"qutlass/qutlass/csrc/fused_quantize_mx_sm100.cu", "qutlass/qutlass/csrc/fused_quantize_nv_sm100.cu"}


@dataclass
class Trees:
    sdist: Path
    upstream: Path
    patched: Path
    work: Path
    series: BuildSeries
    cache: dict[tuple[str, str, str | None], Evaluated]

    def evaluate(self, which: str, archs: str, profile: str | None = None) -> Evaluated:
        from tests.support.vllm_cmake import evaluate

        key = (which, archs, profile)
        if key not in self.cache:
            tree = self.upstream if which == "upstream" else self.patched
            name = f"{which}-{archs.replace(';', '+')}-{profile}"
            self.cache[key] = evaluate(tree, archs, self.work / name, profile, cmake=CMAKE or "cmake")
        return self.cache[key]

    def units(self, which: str, archs: str, profile: str | None = None) -> set[str]:
        return set(self.evaluate(which, archs, profile).units())


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Trees:
    if CMAKE is None:
        pytest.skip("cmake not found")
    from tests.support.trees import sdist_tree
    from tests.support.vllm_cmake import evaluation_tree

    sdist = sdist_tree("vllm-0.21.0")
    root = tmp_path_factory.mktemp("kernel-profile")
    series = get_build_series("vllm-kernel-archs")
    patched = evaluation_tree(sdist, root / "patched")
    _git("init", "-q", cwd=patched)
    _git("add", "-A", cwd=patched)
    _git("commit", "-qm", "upstream vllm 0.21.0 (CMake and csrc)", cwd=patched)
    apply_build_series(patched, series, load_pins().get("vllm-0.21.0"))
    return Trees(sdist=sdist, upstream=evaluation_tree(sdist, root / "upstream"), patched=patched,
                 work=root / "work", series=series, cache={})


def _family_units(series: BuildSeries, profile: str) -> list[str]:
    return [g for lo in left_out(profile, [series]) for g in lo.decision.units]


def _matches(unit: str, globs: list[str] | tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(unit, g) for g in globs)


# --- what each profile compiles ---------------------------------------------------------------------------------

def test_all_is_upstream_less_cutlass_mla_and_c2x_for_12x_and_hopper_lists(trees: Trees) -> None:
    # the profile is unset (a plain build) and set to `all`: the same lists
    # and QuTLASS's sm100 units where QuTLASS targets 12.x (0004)
    for archs, gone in (("12.0f", {MLA, C2X, *QUTLASS_SM100}), ("9.0a", {C2X}),
                        ("9.0a;12.0f", {MLA, C2X, *QUTLASS_SM100})):
        up, default = trees.units("upstream", archs), trees.units("patched", archs)
        assert up - default == gone, archs
        assert default - up == set(), archs
        assert trees.units("patched", archs, "all") == default, archs
    # the 12.0f list: what the recorded 64-core build compiled (62 _C, 18 stable, 28 _moe_C units), less CUTLASS MLA
    # and QuTLASS's two sm100 units
    ev = trees.evaluate("patched", "12.0f")
    assert {t: len(ev.units(t)) for t in ("_C", "_C_stable_libtorch", "_moe_C")} == \
        {"_C": 59, "_C_stable_libtorch": 18, "_moe_C": 28}
    assert ev.left_out == ["CUTLASS_MLA"] and "G4B_NO_CUTLASS_MLA=1" in ev.g4b_defs
    assert "Building CUTLASS MLA" not in ev.log


def test_all_keeps_what_a_pre_hopper_list_compiled(trees: Trees) -> None:
    archs = "7.5;8.0;8.6;8.9"
    assert trees.units("patched", archs) == trees.units("upstream", archs)
    assert trees.evaluate("patched", archs).left_out == []
    assert trees.evaluate("patched", archs).g4b_defs == []


def test_cutlass_mla_stays_for_a_10x_arch(trees: Trees) -> None:
    for archs in ("10.0f", "10.0f;12.0f"):
        assert MLA in trees.units("patched", archs), archs
        assert "CUTLASS_MLA" not in trees.evaluate("patched", archs).left_out, archs


EXPECTED_GEMMA4_DROPS = {
    "12.0f": {"csrc/attention/paged_attention_v1.cu", "csrc/attention/paged_attention_v2.cu",
              "csrc/mamba/mamba_ssm/selective_scan_fwd.cu", "csrc/quantization/gguf/gguf_kernel.cu",
              "csrc/quantization/gptq/q_gemm.cu", "csrc/quantization/awq/gemm_kernels.cu",
              "csrc/quantization/hadamard/hadacore/hadamard_transform_cuda.cu"},
    "9.0a": {"csrc/attention/paged_attention_v1.cu", "csrc/attention/paged_attention_v2.cu",
             "csrc/mamba/mamba_ssm/selective_scan_fwd.cu", "csrc/quantization/gguf/gguf_kernel.cu",
             "csrc/quantization/gptq/q_gemm.cu", "csrc/quantization/awq/gemm_kernels.cu",
             "csrc/quantization/hadamard/hadacore/hadamard_transform_cuda.cu", "csrc/dsv3_fused_a_gemm.cu",
             "csrc/quantization/machete/machete_pytorch.cu", "csrc/moe/dsv3_router_gemm_entry.cu",
             "csrc/moe/dsv3_router_gemm_bf16_out.cu", "csrc/moe/dsv3_router_gemm_float_out.cu"},
}


@pytest.mark.parametrize("archs", ["12.0f", "9.0a", "9.0a;12.0f"])
def test_gemma4_leaves_out_exactly_the_families_it_records(trees: Trees, archs: str) -> None:
    full, gemma4 = trees.units("patched", archs), trees.units("patched", archs, "gemma4")
    assert gemma4 < full
    dropped = full - gemma4
    # each unit gone belongs to a family the decisions table says gemma4 leaves out, and each unit of such a
    # family that `all` compiles is gone
    globs = _family_units(trees.series, "gemma4")
    assert {u for u in dropped if not _matches(u, globs)} == set()
    assert {u for u in gemma4 if _matches(u, globs)} == set()
    # the units named outright (fetched projects and generated files aside)
    named = {u for u in dropped if u.startswith("csrc/") and "/generated/" not in u
             and "/cutlass_w4a8/" not in u and "/w8a8/cutlass/" not in u}
    want = EXPECTED_GEMMA4_DROPS["12.0f"] if archs == "12.0f" else EXPECTED_GEMMA4_DROPS["9.0a"]
    assert named == want
    if "9.0a" in archs:  # Hopper-only families: c3x sm90, grouped_mm sm90, W4A8, FlashMLA
        assert {u for u in dropped if "sm90" in u and "/w8a8/cutlass/" in u} == {
            "csrc/libtorch_stable/quantization/w8a8/cutlass/scaled_mm_c3x_sm90.cu",
            "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_sm90_fp8.cu",
            "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_sm90_int8.cu",
            "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_azp_sm90_int8.cu",
            "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_blockwise_sm90_fp8.cu",
            "csrc/libtorch_stable/quantization/w8a8/cutlass/moe/grouped_mm_c3x_sm90.cu"}
        assert len([u for u in dropped if "/cutlass_w4a8/" in u]) == 3
        assert not [u for u in gemma4 if u.startswith("flashmla/")]
        assert "DeepGEMM CUDA architectures" in trees.evaluate("patched", archs).log
        assert "DeepGEMM CUDA architectures" not in trees.evaluate("patched", archs, "gemma4").log
    if "12.0f" in archs:  # QuTLASS (5 units into _C, its sm100 ones gone already) goes; Gemma 4 NVFP4's stay
        assert len([u for u in dropped if u.startswith("qutlass/")]) == 5
        for kept in ("csrc/libtorch_stable/quantization/fp4/nvfp4_scaled_mm_sm120_kernels.cu",
                     "csrc/libtorch_stable/quantization/fp4/nvfp4_quant_kernels.cu",
                     "csrc/moe/marlin_moe_wna16/ops.cu", "csrc/quantization/marlin/marlin.cu"):
            assert kept in gemma4
    # FlashAttention's sources are not read here; Marlin, Marlin MoE, the norms and the KV cache stay
    for kept in ("csrc/cache_kernels.cu", "csrc/layernorm_kernels.cu", "csrc/activation_kernels.cu",
                 "csrc/custom_all_reduce.cu", "csrc/moe/moe_align_sum_kernels.cu"):
        assert kept in gemma4


@pytest.mark.parametrize("archs", ["12.0f", "9.0a", "9.0a;12.0f"])
def test_the_cmake_says_what_it_left_out_and_defines_it_for_the_bindings(trees: Trees, archs: str) -> None:
    ev = trees.evaluate("patched", archs, "gemma4")
    assert f"g4build kernel profile gemma4: left out: {';'.join(dict.fromkeys(ev.left_out))}" in ev.log
    assert "G4B_KERNEL_PROFILE_GEMMA4=1" in ev.g4b_defs
    assert {d for d in ev.g4b_defs if d.startswith("G4B_NO_")} == {f"G4B_NO_{f}=1" for f in ev.left_out}
    recorded = {f for lo in left_out("gemma4", [trees.series]) for f in lo.decision.cmake_families}
    assert set(ev.left_out) <= recorded
    # only the three bindings get them: every kernel unit compiles as under `all` (compiler caches serve both)
    assert ev.source_definitions == dict.fromkeys(BINDINGS, ev.g4b_defs)
    assert not any(d.startswith("G4B_") for ds in ev.definitions.values() for d in ds)
    assert trees.evaluate("patched", "9.0a").source_definitions == {}  # nothing left out: nothing defined


def test_gemma4_list_in_the_cmake_is_the_decisions_table(trees: Trees) -> None:
    text = (trees.patched / "CMakeLists.txt").read_text(encoding="utf-8")
    block = re.search(r"set\(G4B_GEMMA4_LEAVES_OUT\s+([^)]*)\)", text)
    assert block is not None
    in_cmake = set(block[1].split())
    in_table = {f for lo in left_out("gemma4", [trees.series]) for f in lo.decision.cmake_families}
    assert in_cmake == in_table
    assert {f for lo in left_out("all", [trees.series]) for f in lo.decision.cmake_families} == {"CUTLASS_MLA"}


@pytest.mark.parametrize("archs", ["12.0f", "9.0a"])
def test_every_unit_compiled_belongs_to_a_recorded_family(trees: Trees, archs: str) -> None:
    globs = [g for d in trees.series.decisions for g in d.units]
    for profile in ("all", "gemma4"):
        loose = sorted(u for u in trees.units("patched", archs, profile) if not _matches(u, globs))
        assert loose == [], (archs, profile)


def test_an_unknown_profile_stops_the_configure(trees: Trees) -> None:
    from tests.support.vllm_cmake import evaluate

    with pytest.raises(RuntimeError, match=r"G4B_KERNEL_PROFILE must be 'all' or 'gemma4', got\s+'gemma'"):
        evaluate(trees.patched, "12.0f", trees.work / "bad", "gemma", cmake=CMAKE or "cmake")


# --- the bindings -----------------------------------------------------------------------------------------------

_IMPL = re.compile(r'\b(?:m|ops)\.impl\(\s*"(\w+)"')
_FALLBACK = re.compile(r'\.impl\(\s*"(\w+)",\s*(?:torch::kCUDA,\s*)?g4b_not_compiled\(\)\)')


def _guarded(text: str, family: str) -> str:
    """The lines between each #ifdef/#ifndef G4B_NO_<family> and its own #endif (nested #if blocks included)."""
    found: list[str] = []
    depth = 0  # > 0: inside a guard of the family, counting the #if blocks open
    for line in text.splitlines():
        directive = line.strip()
        if depth:
            depth += directive.startswith("#if") - directive.startswith("#endif")
            if depth:
                found.append(line)
        elif re.match(rf"#ifn?def G4B_NO_{family}\b", directive):
            depth = 1
    return "\n".join(found)


def test_every_op_a_left_out_family_registers_gets_the_not_compiled_kernel(trees: Trees) -> None:
    c = (trees.patched / "csrc/torch_bindings.cpp").read_text(encoding="utf-8")
    moe = (trees.patched / "csrc/moe/torch_bindings.cpp").read_text(encoding="utf-8")
    stable = (trees.patched / "csrc/libtorch_stable/torch_bindings.cpp").read_text(encoding="utf-8")
    bindings = c + moe + stable
    # families whose sources register their own kernels: each op they register has the fallback under its guard
    own = {"MACHETE": ["csrc/quantization/machete/machete_pytorch.cu"], "CUTLASS_MLA": [MLA],
           "DSV3_FUSED_A": ["csrc/dsv3_fused_a_gemm.cu"], "DSV3_ROUTER": ["csrc/moe/dsv3_router_gemm_entry.cu"],
           "HADACORE": ["csrc/quantization/hadamard/hadacore/hadamard_transform_cuda.cu"],
           "ALLSPARK": ["csrc/quantization/gptq_allspark/allspark_repack.cu",
                        "csrc/quantization/gptq_allspark/allspark_qgemm_w8a16.cu"],
           "W4A8": ["csrc/libtorch_stable/quantization/cutlass_w4a8/w4a8_mm_entry.cu",
                    "csrc/libtorch_stable/quantization/cutlass_w4a8/w4a8_grouped_mm_entry.cu"]}
    for family, sources in own.items():
        registered = {op for s in sources for op in _IMPL.findall((trees.sdist / s).read_text(encoding="utf-8"))}
        assert registered, family
        guarded = _guarded(bindings, family)
        stubbed = set(_FALLBACK.findall(guarded)) | set(re.findall(r'G4B_STABLE_NOT_COMPILED\(\w+, "(\w+)"\)',
                                                                   guarded))
        assert stubbed == registered, family
    # families the bindings register themselves: each impl guarded out has the fallback in its #else
    for family in ("PAGED_ATTENTION", "MAMBA", "GGUF", "GPTQ", "AWQ"):
        blocks = re.findall(rf"#ifndef G4B_NO_{family}\n(.*?)#else\n(.*?)#endif", c, flags=re.S)
        assert blocks, family
        for real, fallback in blocks:
            assert _IMPL.findall(real) or "ops.def(" in real
            assert set(_IMPL.findall(real)) == set(_FALLBACK.findall(fallback)), family
    # the upstream registrations of those ops are all inside the guards (none left outside to link against)
    outside = re.sub(r"#ifndef G4B_NO_\w+\n.*?#endif", "", c, flags=re.S)
    for op in ("paged_attention_v1", "paged_attention_v2", "selective_scan_fwd", "awq_gemm", "awq_dequantize",
               "gptq_gemm", "gptq_shuffle", "ggml_dequantize", "ggml_mul_mat_a8", "ggml_moe_a8_vec"):
        assert f'ops.impl("{op}"' not in outside, op
    assert 'ops.def("ggml_moe_get_block_size", &' not in outside


def _gxx(tree: Path, source: str, defs: list[str]) -> subprocess.CompletedProcess[str]:
    import torch

    inc = Path(torch.__file__).parent / "include"
    flags = ["-DTORCH_EXTENSION_NAME=_C"]
    if "libtorch_stable" in source:  # the flags CMake gives _C_stable_libtorch
        flags += ["-DUSE_CUDA", "-DTORCH_TARGET_VERSION=0x020A000000000000ULL"]
    cmd = [GXX or "g++", "-std=c++20", "-fsyntax-only", *flags, *[f"-D{d}" for d in defs], "-I", str(tree / "csrc"),
           "-I", str(inc), "-I", str(inc / "torch/csrc/api/include"), "-I", sysconfig.get_paths()["include"],
           str(tree / source)]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.mark.skipif(GXX is None or not Path(sysconfig.get_paths()["include"], "Python.h").is_file(),
                    reason="g++ or Python.h not found")
@pytest.mark.parametrize("profile", ["all", "gemma4"])
def test_the_patched_bindings_compile_with_each_profiles_definitions(trees: Trees, profile: str) -> None:
    pytest.importorskip("torch")
    defs = sorted(set(trees.evaluate("patched", "9.0a", profile).g4b_defs)
                  | set(trees.evaluate("patched", "9.0a;12.0f", profile).g4b_defs))
    assert ("G4B_NO_MACHETE=1" in defs) == (profile == "gemma4")
    assert "G4B_NO_CUTLASS_MLA=1" in defs
    for source in ("csrc/torch_bindings.cpp", "csrc/moe/torch_bindings.cpp",
                   "csrc/libtorch_stable/torch_bindings.cpp"):
        done = _gxx(trees.patched, source, defs)
        assert done.returncode == 0, (source, done.stderr[-3000:])


def _schema(bindings: str, op: str) -> str:
    """The schema string upstream's bindings give ``op`` (its concatenated literals)."""
    for m in re.finditer(r'ops\.def\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)', bindings):
        schema = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m[1]))
        if schema.startswith(op + "("):
            return schema
    raise AssertionError(f"no schema for {op}")


@pytest.mark.skipif(GXX is None, reason="g++ not found")
@pytest.mark.parametrize("profile", ["all", "gemma4"])
def test_a_left_out_op_raises_the_not_compiled_message_when_called(trees: Trees, tmp_path: Path,
                                                                     profile: str) -> None:
    """The patched helper, compiled into a real torch library: one boxed kernel serves upstream's schemas of
    different shapes (a tensor op, an op returning nothing, an int -> int op defined with it), registered as a
    backend kernel and as a catch-all; calling any raises the message naming op, profile and fix."""
    torch = pytest.importorskip("torch")
    bindings = (trees.patched / "csrc/torch_bindings.cpp").read_text(encoding="utf-8")
    start = bindings.index("#ifdef G4B_KERNEL_PROFILE_GEMMA4")
    helper = bindings[start:bindings.index("}  // namespace", start) + len("}  // namespace")]
    ns = f"g4btest_{profile}"
    source = tmp_path / "fallback.cpp"
    source.write_text("\n".join([
        "#include <torch/library.h>", "#include <ATen/core/dispatch/Dispatcher.h>", "#include <ATen/core/stack.h>",
        helper,
        f"TORCH_LIBRARY({ns}, m) {{",
        f'  m.def("{_schema(bindings, "machete_mm")}");',
        f'  m.def("{_schema(bindings, "paged_attention_v1")}");',
        '  m.def("ggml_moe_get_block_size(int _0) -> int", g4b_not_compiled());',
        "}",
        f"TORCH_LIBRARY_IMPL({ns}, CPU, m) {{",
        '  m.impl("paged_attention_v1", g4b_not_compiled());', "}",
        f"TORCH_LIBRARY_IMPL({ns}, CatchAll, m) {{",
        '  m.impl("machete_mm", g4b_not_compiled());', "}", ""]), encoding="utf-8")
    inc, lib = Path(torch.__file__).parent / "include", Path(torch.__file__).parent / "lib"
    out = tmp_path / f"lib{ns}.so"
    defs = ["-DG4B_KERNEL_PROFILE_GEMMA4=1"] if profile == "gemma4" else []
    done = subprocess.run([GXX or "g++", "-std=c++17", "-shared", "-fPIC", "-O0", *defs,
                           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
                           "-I", str(inc), "-I", str(inc / "torch/csrc/api/include"), str(source), "-o", str(out),
                           "-L", str(lib), "-ltorch", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    torch.ops.load_library(str(out))
    ops = getattr(torch.ops, ns)
    assert hasattr(ops, "machete_mm") and hasattr(ops, "paged_attention_v1")  # the probes vLLM makes
    t = torch.zeros(2)
    calls = {"machete_mm": lambda: ops.machete_mm(t, t, 0, None, None, None, None, None, None, None),
             "paged_attention_v1": lambda: ops.paged_attention_v1(
                 t, t, t, t, 1, 1.0, t, t, 16, 16, None, "auto", t, t, 0, 0, 0, 64, 0),
             "ggml_moe_get_block_size": lambda: ops.ggml_moe_get_block_size(2)}
    for op, call in calls.items():
        with pytest.raises(RuntimeError) as err:
            call()
        assert (f"{ns}::{op} is not compiled into this build (g4build kernel profile '{profile}' / no kernel for "
                "this GPU): rebuild with --kernels all") in str(err.value)
