from __future__ import annotations

import pytest

from g4build.builder.arch import (
    UPSTREAM_DEFAULT_ARCH_LIST,
    check_cuda,
    check_os_arch,
    cuda_arch_list,
    flashinfer_arch_list,
    gencode_flags,
    parse_arch,
)
from g4build.errors import UsageError


@pytest.mark.parametrize("spelling", ["sm120", "sm_120", "SM_120", "12.0", "12.0a", "12.0f", "compute_120",
                                      "120", "12.0+PTX", " sm120 "])
def test_every_spelling_of_sm120_is_one_arch(spelling: str) -> None:
    assert parse_arch(spelling).name == "sm120"


@pytest.mark.parametrize(("spelling", "name"), [("sm121", "sm121"), ("12.1a", "sm121"), ("sm100", "sm100"),
                                                ("10.0f", "sm100"), ("sm_90", "sm90"), ("9.0a", "sm90"),
                                                ("90", "sm90")])
def test_other_archs(spelling: str, name: str) -> None:
    assert parse_arch(spelling).name == name


@pytest.mark.parametrize("bad", ["sm86", "8.6", "sm_75", "banana", "", "12.0x", "sm1200"])
def test_unknown_arch_is_a_usage_error_naming_the_known_ones(bad: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_arch(bad)
    assert "sm120" in err.value.message


@pytest.mark.parametrize(("arch", "cuda", "expected"), [
    ("sm120", "12.8", "12.0a"), ("sm120", "12.9", "12.0a"), ("sm120", "13.0", "12.0f"), ("sm120", "13.2", "12.0f"),
    ("sm121", "12.9", "12.1a"), ("sm121", "13.0", "12.0f"),
    ("sm100", "12.8", "10.0a"), ("sm100", "13.0", "10.0f"),
    ("sm90", "12.8", "9.0a"), ("sm90", "13.0", "9.0a"),
])
def test_arch_list_uses_specific_targets_below_cuda_13_and_family_targets_from_13(
    arch: str, cuda: str, expected: str
) -> None:
    info = parse_arch(arch)
    assert cuda_arch_list(info, cuda) == expected
    assert flashinfer_arch_list(info, cuda) == expected
    assert "+PTX" not in expected and expected != info.compute_capability  # never the plain form


def test_cuda_too_old_for_sm120() -> None:
    with pytest.raises(UsageError, match=r"needs CUDA >= 12.8"):
        check_cuda(parse_arch("sm120"), "12.6", flashinfer=False)


def test_flashinfer_needs_cuda_12_9_for_sm120() -> None:
    check_cuda(parse_arch("sm120"), "12.8", flashinfer=False)
    with pytest.raises(UsageError, match=r"FlashInfer.*12.9"):
        check_cuda(parse_arch("sm120"), "12.8", flashinfer=True)


def test_os_arch_combinations() -> None:
    check_os_arch("windows", parse_arch("sm120"))
    check_os_arch("linux", parse_arch("sm121"))
    with pytest.raises(UsageError, match="not a target on windows"):
        check_os_arch("windows", parse_arch("sm121"))
    with pytest.raises(UsageError, match="unknown OS"):
        check_os_arch("macos", parse_arch("sm120"))


def test_gencode_flags() -> None:
    assert gencode_flags("12.0f") == ["-gencode=arch=compute_120f,code=sm_120f"]
    flags = gencode_flags(UPSTREAM_DEFAULT_ARCH_LIST)
    assert len(flags) == 9  # eight SASS targets and PTX for 12.0
    assert flags[-1] == "-gencode=arch=compute_120,code=compute_120"
    with pytest.raises(UsageError):
        gencode_flags("12.0z")
