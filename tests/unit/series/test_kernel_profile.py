"""Kernel profiles as the vllm-kernel-archs series records them (the real patches/deps data) and as a plan reads
them: what each profile leaves out and why, the CMake argument, and the decisions' profile keys checked on load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from g4build.builder.kernels import build_option_args
from g4build.data import patches_dir
from g4build.errors import ConfigError, UsageError
from g4build.series.deps import KERNEL_PROFILES, get_build_series, load_build_series
from g4build.series.kernelprofile import CMAKE_VARIABLE, DEFAULT, check_profile, left_out

SERIES = "vllm-kernel-archs"


def test_the_profiles_and_the_cmake_argument() -> None:
    assert KERNEL_PROFILES == ("all", "gemma4") and DEFAULT == "all" and CMAKE_VARIABLE == "G4B_KERNEL_PROFILE"
    assert build_option_args("gemma4", "all") == "-DG4B_KERNEL_PROFILE=gemma4 -DG4B_FA2_HEADDIMS=128;256"
    assert build_option_args("all", "all") == ""  # the default passes nothing: its CMake arguments stay as they were
    assert check_profile("gemma4") == "gemma4"


def test_an_unknown_profile_is_a_usage_error_naming_the_known_ones() -> None:
    with pytest.raises(UsageError, match=r"unknown kernel profile 'gemma'.*all, gemma4") as err:
        check_profile("gemma")
    assert err.value.exit_code == UsageError.exit_code
    with pytest.raises(UsageError):
        left_out("", [get_build_series(SERIES)])


def test_all_leaves_out_only_what_no_requested_gpu_runs() -> None:
    [mla] = left_out("all", [get_build_series(SERIES)])
    assert mla.series == SERIES and mla.decision.cmake_families == ("CUTLASS_MLA",)
    assert mla.decision.units == ("csrc/attention/mla/sm100_cutlass_mla_kernel.cu",)
    assert "10.x" in mla.decision.why and "tcgen05" in mla.decision.why


def test_gemma4_leaves_out_the_families_gemma4_never_calls_each_with_why_and_units() -> None:
    found = left_out("gemma4", [get_build_series(SERIES)])
    families = {f for lo in found for f in lo.decision.cmake_families}
    assert families == {"PAGED_ATTENTION", "MAMBA", "GGUF", "GPTQ", "AWQ", "ALLSPARK", "CUTLASS_MLA", "DSV3_FUSED_A",
                        "DSV3_ROUTER", "MACHETE", "HADACORE", "SCALED_MM_SM90", "SCALED_MM_SM100", "CUTLASS_MOE_SM90",
                        "CUTLASS_MOE_SM100", "W4A8", "FLASHMLA", "DEEPGEMM", "QUTLASS"}
    for lo in found:
        assert lo.decision.units and lo.decision.why, lo.decision.family
    # what Gemma 4 runs is never left out: Marlin (dense and MoE), NVFP4 sm120, the core kernels
    kept = [d for d in get_build_series(SERIES).decisions if "gemma4" not in d.left_out_in]
    assert any(d.family.startswith("Marlin MoE") for d in kept)
    assert any("NVFP4 sm120" in d.family for d in kept)
    assert any(d.family.startswith("_C core") for d in kept)


def test_decisions_print_their_profile_keys() -> None:
    rows = [d.to_dict() for d in get_build_series(SERIES).decisions]
    mla = next(r for r in rows if r["family"].startswith("CUTLASS MLA"))
    assert mla["left_out_in"] == ["all", "gemma4"] and mla["cmake_family"] == ["CUTLASS_MLA"]
    fa2 = next(r for r in rows if r["family"].startswith("FlashAttention 2"))
    assert "left_out_in" not in fa2 and "units" not in fa2


def _series_with(tmp_path: Path, old: str, new: str) -> Path:
    folder = tmp_path / SERIES
    shutil.copytree(patches_dir() / "deps" / SERIES, folder)
    meta = folder / "series.yaml"
    text = meta.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    meta.write_text(text.replace(old, new), encoding="utf-8")
    return folder


@pytest.mark.parametrize(("old", "new", "match"), [
    ("    left_out_in: [gemma4]\n    cmake_family: MAMBA\n", "    left_out_in: [gemma5]\n    cmake_family: MAMBA\n",
     r"left_out_in: expected a list of kernel profiles \(all, gemma4\), found \['gemma5'\]"),
    ("    cmake_family: MAMBA\n", "    cmake_family: mamba\n", r"cmake_family: expected CMake family names"),
    ("    cmake_family: MAMBA\n", "", r"left_out_in and cmake_family go together"),
    ("    units: [csrc/mamba/mamba_ssm/selective_scan_fwd.cu]\n", "    units: csrc/mamba\n",
     r"units: expected a list of path globs"),
])
def test_bad_profile_keys_are_config_errors(tmp_path: Path, old: str, new: str, match: str) -> None:
    folder = _series_with(tmp_path, old, new)
    with pytest.raises(ConfigError, match=match):
        load_build_series(folder)


def test_the_copy_loads_as_the_real_series(tmp_path: Path) -> None:  # the edits above are the only difference
    folder = _series_with(tmp_path, "version: 4\n", "version: 4\n")
    assert load_build_series(folder).decisions == get_build_series(SERIES).decisions


def test_deps_list_says_which_profile_leaves_a_family_out(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from g4build.cli import main

    main(["deps", "list"])
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "CUTLASS MLA (sm100_cutlass_mla_kernel.cu) (MLA_ARCHS, upstream 10.0f;11.0f;12.0f): patch [left out in: " \
           "all, gemma4]" in out
    assert "Marlin MoE (moe marlin sm80 kernels) (MARLIN_MOE_ARCHS, upstream 8.0+PTX): patch —" in out
    main(["deps", "list", "--json"])
    kernels = json.loads(capsys.readouterr().out)["build_series"][1]
    paged = next(d for d in kernels["decisions"] if d["family"].startswith("Paged attention"))
    assert paged["left_out_in"] == ["gemma4"] and paged["cmake_family"] == ["PAGED_ATTENTION"]
