"""The GPU guard's arch model: the condition the launch scripts test agrees with validate's fatbin model (CUDA's
binary compatibility rules) on every compute capability; the arch list from a wheel is parsed strictly."""

from __future__ import annotations

import pytest

from g4build.errors import RecipeError
from g4build.recipes.gpu_guard import KernelTarget, condition, parse_kernel_archs, recorded_archs
from g4build.validate.fatbin import Arch, FatbinEntry

FORMS = ["8.0", "8.6", "9.0", "9.0a", "10.0f", "12.0", "12.0a", "12.0f", "12.1a", "8.0+PTX", "9.0a+PTX",
         "12.0f+PTX", "sm120", "sm_90a", "SM_120F", "12.0+ptx"]
PY_OPS = {"eq": "==", "ge": ">=", "gt": ">", "and": "and", "or": "or"}


def fatbin_says(t: KernelTarget, major: int, minor: int) -> bool:
    """validate's model of a fatbin entry (CUDA's rules): the SASS nvcc embeds, and its PTX with +PTX."""
    gpu, arch = Arch(major=major, minor=minor), Arch(major=t.major, minor=t.minor, suffix=t.suffix)
    sass = FatbinEntry(kind="sass", arch=arch, size=0, compression=None)
    ptx = FatbinEntry(kind="ptx", arch=arch, size=0, compression=None)
    return sass.runs_on(gpu) or (t.ptx and ptx.jits_for(gpu))


@pytest.mark.parametrize("form", FORMS)
def test_the_scripts_condition_is_cudas_rule(form: str) -> None:
    (target,) = parse_kernel_archs(form, "test")
    test = condition(target, "cap_major", "cap_minor", PY_OPS)
    for major in range(5, 16):
        for minor in range(10):
            scripted = eval(test, {}, {"cap_major": major, "cap_minor": minor})
            assert scripted == fatbin_says(target, major, minor), (form, major, minor, test)


def test_the_rules_named() -> None:
    def runs(form: str, cc: tuple[int, int]) -> bool:
        return any(fatbin_says(t, *cc) for t in parse_kernel_archs(form, "test"))

    assert runs("12.0f", (12, 1)) and not runs("12.0f", (9, 0)) and not runs("12.0f", (13, 0))
    assert runs("8.0", (8, 9)) and not runs("8.0", (9, 0))  # SASS: same major, newer minor
    assert runs("9.0a", (9, 0)) and not runs("9.0a", (10, 0)) and not runs("12.0a", (12, 1))
    assert runs("8.0+PTX", (12, 0)) and not runs("12.0+PTX", (9, 0))  # PTX: JIT-compiled forward
    assert not runs("12.0f+PTX", (13, 0)) and not runs("9.0a+PTX", (10, 0))


def test_lists_parse_in_both_separators_and_once_each() -> None:
    assert parse_kernel_archs(" 9.0a;12.0f  12.0f ", "w") == (
        KernelTarget(major=9, minor=0, suffix="a"), KernelTarget(major=12, minor=0, suffix="f"))
    assert parse_kernel_archs("sm120", "w")[0].spelled == "12.0"
    assert parse_kernel_archs("8.0+ptx", "w")[0].spelled == "8.0+PTX"


@pytest.mark.parametrize("bad", ["", "  ", "12.0f$(id)", "12.0f;rm -rf /", "12.0x", "compute_120", "0.0", "sm_00",
                                 "120.0", "12.10", "12.0f\n`id`", "12.0ff", " ".join(["9.0"] * 17)])
def test_anything_else_is_a_recipe_error(bad: str) -> None:
    with pytest.raises(RecipeError, match=r"^x\.whl's manifest: expected") as caught:
        parse_kernel_archs(bad, "x.whl's manifest")
    assert caught.value.exit_code == 11 and "g4build wheel --arch" in (caught.value.hint or "")


def test_only_a_build_records_kernels() -> None:
    built = {"route": "build", "target": {"arch": "sm120"}, "env": {"TORCH_CUDA_ARCH_LIST": "12.0f"}}
    assert recorded_archs(built) == "12.0f"
    assert recorded_archs({**built, "env": {}}) == "sm120"  # no list recorded: the build's target
    assert recorded_archs({**built, "route": "overlay"}) is None  # an overlay's kernels are its source wheel's
    assert recorded_archs({"route": "build", "target": {"arch": None}}) is None
    assert recorded_archs({"route": "build", "env": {"TORCH_CUDA_ARCH_LIST": 12}, "target": "x"}) is None
    assert recorded_archs(None) is None and recorded_archs([built]) is None
