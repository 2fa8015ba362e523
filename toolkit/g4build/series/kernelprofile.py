"""Kernel profiles: which kernel families a build of vLLM compiles, as the vllm-kernel-archs build series
implements them (its CMake cache variable G4B_KERNEL_PROFILE) and records them (its decisions' ``left_out_in``).
The plan names the profile, passes it to CMake (builder.kernels, with CMAKE_VARIABLE), and prints :func:`left_out`
with each why."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from g4build.errors import UsageError
from g4build.series.deps import KERNEL_PROFILES, BuildSeries, Decision

CMAKE_VARIABLE = "G4B_KERNEL_PROFILE"
DEFAULT = KERNEL_PROFILES[0]


@dataclass(frozen=True)
class LeftOut:
    """One family a profile leaves out: the series that records it and its decision (family, why)."""

    series: str
    decision: Decision


def check_profile(profile: str) -> str:
    if profile not in KERNEL_PROFILES:
        raise UsageError(f"unknown kernel profile {profile!r}: expected one of {', '.join(KERNEL_PROFILES)}",
                         hint="`--kernels all` builds every family vLLM has; `--kernels gemma4` only Gemma 4's")
    return profile


def left_out(profile: str, build: Iterable[BuildSeries]) -> list[LeftOut]:
    """The families ``profile`` leaves out, in the build series' order. `all` lists only those no GPU of the
    requested archs runs (the decision's why says for which lists)."""
    check_profile(profile)
    return [LeftOut(b.name, d) for b in build for d in b.decisions if profile in d.left_out_in]


def implementing(profile: str, build: Iterable[BuildSeries]) -> list[BuildSeries]:
    """The build series among ``build`` that implement ``profile`` (one of their decisions leaves a family out of
    it); none for `all`, which every tree builds."""
    if profile == "all":
        return []
    series = list(build)
    names = {lo.series for lo in left_out(profile, series)}
    return [b for b in series if b.name in names]
