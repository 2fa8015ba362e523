"""What a build compiles beyond the arch list: vLLM's kernel profile (``--kernels``) and the FlashAttention versions
(``--flash-attn``), as CMake cache variables that the build series read (vllm-kernel-archs: ``G4B_KERNEL_PROFILE``;
vllm-flash-attn: ``G4B_FLASH_ATTN``). A default build passes neither, so its CMake arguments stay as they were."""

from __future__ import annotations

from collections.abc import Sequence

from g4build.errors import UsageError
from g4build.series.deps import KERNEL_PROFILES, BuildSeries  # the build series' own list: all, gemma4
from g4build.series.kernelprofile import CMAKE_VARIABLE, check_profile, implementing

# --kernels auto (the default): the profile an arch gets when the build series that implement it apply to the
# tree, else `all`. sm120: gemma4, measured at 15.2 minutes on 16 cores against ~22 for all (issue of the
# desktop's build), and the same profile built for sm_90 served Gemma 4 with DFlash and MTP as the reference
# predicts. Elsewhere all: on 9.0a gemma4 leaves out Hopper FP8 GEMMs that FP8 checkpoints need.
AUTO = "auto"
AUTO_PROFILE = {"sm120": "gemma4"}

# "all": FA2, and FA3 with a Hopper arch; "2": FlashAttention 2 alone (an SM120 card's situation, on any GPU)
FLASH_ATTN_CHOICES = ("all", "2")
FLASH_ATTN_SERIES = "vllm-flash-attn"  # the build series that reads G4B_FLASH_ATTN (and G4B_FA2_HEADDIMS)
# FA2's kernel head dims (its dispatch rounds a head dim up to one of 32 64 96 128 192 256) that Gemma 4 and its
# drafters reach: the DFlash drafter's 128 and the target's sliding layers' 256 (its full layers' 512 are past
# FA2: Triton runs them). The gemma4 profile compiles only these (vllm-flash-attn's G4B_FA2_HEADDIMS).
GEMMA4_FA2_HEAD_DIMS = (128, 256)


def build_option_args(kernels: str, flash_attn: str) -> str:
    """The CMake cache variables for --kernels and --flash-attn (empty for the defaults)."""
    args = []
    if kernels != "all":
        args.append(f"-D{CMAKE_VARIABLE}={check_profile(kernels)}")
        args.append("-DG4B_FA2_HEADDIMS=" + ";".join(map(str, GEMMA4_FA2_HEAD_DIMS)))
    if flash_attn != "all":
        args.append(f"-DG4B_FLASH_ATTN={flash_attn}")
    return " ".join(args)


def version_words(kernels: str, flash_attn: str) -> tuple[str, ...]:
    """The words a wheel's local label gets for what its build left out (none for the defaults): a launch script
    skips installing a version it finds installed, so a rebuild with other kernels must be another version."""
    return (*((check_profile(kernels),) if kernels != "all" else ()),
            *(("fa" + flash_attn,) if flash_attn != "all" else ()))


def way_to(missing: Sequence[BuildSeries], pin: str, what: str = "the profile") -> str:
    """Where ``what`` is to be had: WSL when the series cover ``pin`` and only the Windows base tree lacks them
    (it is not the pin's own tree), else the pins they cover."""
    if all(b.series.variant(pin) is not None for b in missing):
        return f"a build under WSL (--os wsl) has {what}"
    covered = sorted(set.intersection(*(set(b.series.pins) for b in missing)))
    if not covered:
        return f"no pin has {what}"
    return "a build of " + " or ".join(f"--pin {p}" for p in covered) + f" has {what}"


def check_flash_attn(flash_attn: str, uncovered: Sequence[BuildSeries], where: str, pin: str) -> None:
    """A --flash-attn other than `all` needs the series that reads it (UsageError, exit 2, otherwise): without it
    FA3 is compiled anyway while the plan, the manifest and the wheel's version said FA2 alone."""
    if flash_attn != "all" and (missing := [b for b in uncovered if b.name == FLASH_ATTN_SERIES]):
        raise UsageError(
            f"--flash-attn {flash_attn}: the build series {FLASH_ATTN_SERIES}, which implements it "
            f"(G4B_FLASH_ATTN), has no variant for {where}: FlashAttention would be built as that tree has it",
            hint=f"leave --flash-attn out; {way_to(missing, pin, 'it')}")


def resolve_kernels(kernels: str, arch: str, uncovered: Sequence[BuildSeries], where: str,
                    pin: str) -> tuple[str, list[str]]:
    """The kernel profile the build uses, and its note: ``auto`` picks the arch's profile where every build series
    implementing it applies to the tree (``where`` names the tree, ``pin`` the pin), else `all`; a profile asked
    for by name whose series has no variant for the tree is refused (UsageError, exit 2): vLLM's own kernels would
    all be built while the plan, the estimate and the manifest said otherwise."""
    if kernels == AUTO:
        want = AUTO_PROFILE.get(arch, "all")
        if want == "all":
            return "all", []
        if missing := implementing(want, uncovered):
            return "all", [f"kernel profile all (--kernels auto): {arch}'s default, {want}, needs the build series "
                           f"{', '.join(b.name for b in missing)}, which has no variant for {where}; "
                           f"{way_to(missing, pin)}"]
        return want, [f"kernel profile {want}: the default for {arch} (--kernels auto); --kernels all builds every "
                      "kernel family vLLM has, for models other than Gemma 4"]
    if missing := implementing(kernels, uncovered):
        raise UsageError(
            f"--kernels {kernels}: the build series {', '.join(b.name for b in missing)}, which implements the "
            f"profile ({CMAKE_VARIABLE}), has no variant for {where}: vLLM's own kernels would all be compiled "
            "anyway",
            hint=f"use --kernels all (or leave --kernels out); {way_to(missing, pin)}")
    return kernels, []


def check_build_options(kernels: str, flash_attn: str, *, auto: bool = False) -> None:
    """--kernels / --flash-attn name a known choice (UsageError, exit 2, with the choices otherwise); ``auto``:
    the caller resolves `auto` itself (g4build wheel), so it is among the choices (not the manifest's)."""
    choices = (AUTO, *KERNEL_PROFILES) if auto else KERNEL_PROFILES
    if kernels not in choices:
        raise UsageError(f"--kernels {kernels!r}: expected one of {', '.join(choices)}",
                         hint="--kernels gemma4 builds only what Gemma 4 and its drafters run, all every family; "
                              + ("auto (the default) picks gemma4 for sm120" if auto else
                                 "the manifest records the profile the build resolved"))
    if flash_attn not in FLASH_ATTN_CHOICES:
        raise UsageError(f"--flash-attn {flash_attn!r}: expected one of {', '.join(FLASH_ATTN_CHOICES)}",
                         hint="--flash-attn 2 builds FlashAttention 2 alone (what an SM120 card has)")


def option_notes(kernels: str, flash_attn: str, leaves_out: list[str]) -> list[str]:
    """The plan's notes for the chosen options; ``leaves_out``: the families the profile leaves out (with why),
    from the build series' decisions table."""
    notes = []
    if kernels != "all":
        notes.append(f"kernel profile {kernels} (G4B_KERNEL_PROFILE): only the kernel families Gemma 4 and its "
                     "drafters call are compiled; an op left out raises 'not compiled into this build' if called")
        notes += [f"kernel profile {kernels} leaves out {family}" for family in leaves_out]
        dims = ", ".join(map(str, GEMMA4_FA2_HEAD_DIMS))
        notes.append(f"kernel profile {kernels}: FlashAttention 2 for head dims {dims} only (G4B_FA2_HEADDIMS; 20 "
                     "of its 52 units): a call with another head dim raises 'not compiled into this build'")
    if flash_attn == "2":
        notes.append("FlashAttention 2 alone (G4B_FLASH_ATTN=2): no FA3 even for a Hopper arch; vLLM then runs "
                     "FlashAttention 2, as on an SM120 card")
    return notes
