"""Rules that fit a recipe to its pin and to the wheel it installs, at their edges: a --set value against the
pin's recorded argument table, a 0.21.0 variable respelled for a later pin, the KV cache group size, and the
wheel's platform and arch against the script and the card."""

from __future__ import annotations

import pytest

from g4build.errors import UsageError
from g4build.recipes.draft_groups import kv_groups
from g4build.recipes.findings import WheelInfo
from g4build.recipes.renamed_env import load_renamed, respell
from g4build.recipes.vllm_args import check_sets
from g4build.recipes.wheelfit import arch_warning, platform_finding

GEMM = "VLLM_NVFP4_GEMM_BACKEND"


# --- --set values against the pin's recorded table (offline: recipes/vllm-args/<pin>.json) ---------------------
@pytest.mark.parametrize("value", ["true", "false"])
def test_a_bool_is_no_integer_for_an_int_option(value: str) -> None:
    with pytest.raises(UsageError, match=r"expected an integer \(vLLM 0.21.0 declares it int\), found bool"):
        check_sets([f"args.max-num-seqs={value}"], "vllm-0.21.0")


def test_integer_bounds_hold_at_their_edge() -> None:
    done = check_sets(["args.max-num-seqs=1", "args.max-model-len=-1", "speculative.num_speculative_tokens=1"],
                      "vllm-0.21.0")
    assert done.checked and done.version == "0.21.0"
    for item, words in (("args.max-num-seqs=0", "at least 1"), ("args.max-model-len=-2", "at least -1"),
                        ("speculative.num_speculative_tokens=0", "greater than 0")):
        with pytest.raises(UsageError, match=words):
            check_sets([item], "vllm-0.21.0")


# --- 0.21.0's variables in a later pin's spelling -----------------------------------------------------------------
def test_a_variable_is_respelled_only_for_a_pin_that_has_the_option() -> None:
    renamed = load_renamed()
    has = frozenset({"linear-backend", "moe-backend"})
    found = respell(GEMM, "flashinfer-cutlass", renamed, has)
    assert found is not None and (found.option, found.value) == ("linear-backend", "flashinfer_cutlass")
    assert respell(GEMM, "flashinfer-cutlass", renamed, frozenset({"moe-backend"})) is None  # the pin lacks it
    assert respell(GEMM, "flashinfer-cutlass", renamed, None) is None  # no table: not known


@pytest.mark.parametrize("value", ["FlashInfer-Cutlass", " flashinfer-cutlass ", "FLASHINFER-CUTLASS"])
def test_respelling_reads_the_value_as_vllm_does_case_and_space_aside(value: str) -> None:
    found = respell(GEMM, value, load_renamed(), frozenset({"linear-backend"}))
    assert found is not None and found.value == "flashinfer_cutlass" and found.was == value


# --- 0.21.0's KV cache groups ---------------------------------------------------------------------------------------
def test_the_group_size_is_the_largest_count_only_under_one_and_a_half_times_the_smallest() -> None:
    assert kv_groups([2, 3]).size == 2 and kv_groups([2, 3]).groups == (1, 2)  # 3 is not under 1.5 x 2
    assert kv_groups([4, 5]).size == 5 and kv_groups([4, 5]).groups == (1, 1)
    assert kv_groups([25, 5, 5]).groups == (5, 1, 1)


# --- the wheel against the script and the card -------------------------------------------------------------------
@pytest.mark.parametrize("platform", ["macosx_11_0_arm64", "manylinux_2_28_x86_64", "musllinux_1_2_x86_64"])
def test_a_powershell_script_refuses_every_wheel_windows_pip_cannot_install(platform: str) -> None:
    found = platform_finding(f"vllm-0.21.0-cp38-abi3-{platform}.whl", "powershell")
    assert found is not None and found.severity == "error" and "PowerShell" in found.message
    assert platform_finding("vllm-0.21.0-cp38-abi3-win_amd64.whl", "powershell") is None
    assert platform_finding("vllm-0.21.0-py3-none-any.whl", "powershell") is None


@pytest.mark.parametrize("platform", ["macosx_11_0_arm64", "win_amd64"])
def test_a_bash_script_warns_for_a_wheel_linux_pip_cannot_install(platform: str) -> None:
    found = platform_finding(f"vllm-0.21.0-cp38-abi3-{platform}.whl", "bash")
    assert found is not None and found.severity == "warning"
    assert platform_finding("vllm-0.21.0-cp38-abi3-manylinux_2_28_x86_64.whl", "bash") is None


@pytest.mark.parametrize("built", ["sm121", "sm100", "sm90"])
def test_a_build_for_another_arch_warns(built: str) -> None:
    name = "vllm-0.21.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    found = arch_warning(WheelInfo(file=name, pin="vllm-0.21.0", route="build", arch=built), "sm120", name)
    assert found is not None and f"built by g4build for {built}" in found.message
    assert arch_warning(WheelInfo(file=name, pin=None, route="build", arch="sm_120"), "sm120", name) is None
