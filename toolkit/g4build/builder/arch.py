"""GPU architectures: one canonical form for every spelling users type, and the arch lists a build passes.

``sm120``, ``sm_120``, ``12.0``, ``12.0a``, ``12.0f``, ``compute_120`` all name the same target: SM120
(RTX 5090, RTX PRO 6000). The arch list a build uses depends on the CUDA version: vLLM's CMake only builds
its NVFP4 / CUTLASS kernels for arch-specific (``12.0a``, CUDA < 13) or family (``12.0f``, CUDA >= 13)
targets; a plain ``12.0`` or ``12.0+PTX`` silently leaves them out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import Version

from g4build.errors import UsageError

_SPELLING = re.compile(
    r"^\s*(?:sm_?|compute_?)?(?P<major>\d{1,3})(?:\.(?P<minor>\d))?(?P<suffix>[af])?(?:\+ptx)?\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True, kw_only=True)
class ArchInfo:
    """What g4build knows about one target architecture."""

    name: str  # canonical: "sm120"
    major: int
    minor: int
    gpus: str
    min_cuda: str  # first CUDA that compiles native code for it
    min_cuda_flashinfer: str  # first CUDA FlashInfer's ahead-of-time build supports for it
    family_from_cuda: str | None  # CUDA version from which the family target (``f``) is used
    family_base: str  # the family's base arch (sm121 builds as the 12.0 family)
    specific: bool  # has an arch-specific ``a`` target

    @property
    def compute_capability(self) -> str:
        return f"{self.major}.{self.minor}"


ARCHS: dict[str, ArchInfo] = {
    a.name: a
    for a in (
        ArchInfo(name="sm90", major=9, minor=0, gpus="H100, H200, GH200", min_cuda="12.0",
                 min_cuda_flashinfer="12.3", family_from_cuda=None, family_base="9.0", specific=True),
        ArchInfo(name="sm100", major=10, minor=0, gpus="B200, GB200", min_cuda="12.8",
                 min_cuda_flashinfer="12.8", family_from_cuda="13.0", family_base="10.0", specific=True),
        ArchInfo(name="sm120", major=12, minor=0, gpus="RTX 5090, RTX PRO 6000", min_cuda="12.8",
                 min_cuda_flashinfer="12.9", family_from_cuda="13.0", family_base="12.0", specific=True),
        # CUDA >= 13's CMake in vLLM lists only 12.0 among the 12.x archs; the 12.0 family runs on SM121.
        ArchInfo(name="sm121", major=12, minor=1, gpus="DGX Spark (GB10)", min_cuda="12.9",
                 min_cuda_flashinfer="12.9", family_from_cuda="13.0", family_base="12.0", specific=True),
    )
}

# Which archs each OS can target: Windows and WSL see consumer / workstation Blackwell cards.
OS_ARCHS: dict[str, tuple[str, ...]] = {
    "windows": ("sm120",),
    "wsl": ("sm120",),
    "linux": ("sm90", "sm100", "sm120", "sm121"),
}

# Upstream vLLM's Dockerfile default arch list: what a stock wheel is compiled for.
UPSTREAM_DEFAULT_ARCH_LIST = "7.5 8.0 8.6 8.9 9.0 10.0 11.0 12.0+PTX"


def parse_arch(text: str) -> ArchInfo:
    """Any common spelling of an arch -> its ``ArchInfo`` (raises ``UsageError`` naming the known ones)."""
    match = _SPELLING.match(text)
    known = ", ".join(ARCHS)
    if not match:
        raise UsageError(
            f"unknown arch {text!r}: expected one of {known} (also spelled sm_120, 12.0, 12.0a, 12.0f)",
            hint="use --arch sm120 for an RTX 5090 or RTX PRO 6000",
        )
    major = int(match["major"])
    minor = int(match["minor"] or 0)
    if match["minor"] is None and len(match["major"]) >= 2 and major >= 50:
        # "sm120" / "sm_120" / "120": the last digit is the minor version
        major, minor = divmod(major, 10)
    name = f"sm{major}{minor}"
    if name not in ARCHS:
        raise UsageError(
            f"unsupported arch {text!r} (read as {name}): expected one of {known}",
            hint="g4build builds for Hopper and Blackwell; older GPUs are served by upstream's wheels",
        )
    return ARCHS[name]


def _cuda(text: str) -> Version:
    try:
        return Version(text)
    except Exception as exc:
        raise UsageError(f"not a CUDA version: {text!r}: expected MAJOR.MINOR such as 13.0") from exc


def cuda_arch_list(arch: ArchInfo, cuda: str) -> str:
    """The TORCH_CUDA_ARCH_LIST for ``arch`` with CUDA ``cuda``: ``12.0a`` below 13, ``12.0f`` from 13."""
    if arch.family_from_cuda and _cuda(cuda) >= Version(arch.family_from_cuda):
        return f"{arch.family_base}f"
    return f"{arch.compute_capability}a" if arch.specific else arch.compute_capability


def flashinfer_arch_list(arch: ArchInfo, cuda: str) -> str:
    """FLASHINFER_CUDA_ARCH_LIST: the same spelling; FlashInfer's AOT build knows ``a`` and ``f`` targets."""
    return cuda_arch_list(arch, cuda)


def check_os_arch(os_name: str, arch: ArchInfo) -> None:
    allowed = OS_ARCHS.get(os_name)
    if allowed is None:
        raise UsageError(f"unknown OS {os_name!r}: expected one of {', '.join(OS_ARCHS)}")
    if arch.name not in allowed:
        raise UsageError(
            f"arch {arch.name} ({arch.gpus}) is not a target on {os_name}: expected one of {', '.join(allowed)}",
            hint="build for Linux (--os linux) for data-centre and DGX Spark GPUs",
        )


def check_cuda(arch: ArchInfo, cuda: str, *, flashinfer: bool) -> None:
    """Refuse a CUDA that cannot compile native code for ``arch`` (or FlashInfer's kernels for it)."""
    have = _cuda(cuda)
    if have < Version(arch.min_cuda):
        raise UsageError(
            f"CUDA {cuda} cannot compile for {arch.name}: it needs CUDA >= {arch.min_cuda}",
            hint=f"install CUDA {arch.min_cuda} or newer (13.0 is the pins' default) and pass --cuda",
        )
    if flashinfer and have < Version(arch.min_cuda_flashinfer):
        raise UsageError(
            f"CUDA {cuda} cannot build FlashInfer's kernels for {arch.name}: it needs CUDA >= "
            f"{arch.min_cuda_flashinfer}",
            hint=f"install CUDA {arch.min_cuda_flashinfer} or newer, or build without FlashInfer (--no-flashinfer)",
        )


def gencode_flags(arch_list: str) -> list[str]:
    """nvcc ``-gencode`` flags for a TORCH_CUDA_ARCH_LIST-style list (``8.0 9.0a 12.0f+PTX``)."""
    flags: list[str] = []
    for item in re.split(r"[;\s]+", arch_list.strip()):
        if not item:
            continue
        ptx = item.lower().endswith("+ptx")
        core = item[:-4] if ptx else item
        m = re.fullmatch(r"(\d+)\.(\d)([af]?)", core)
        if not m:
            raise UsageError(f"arch list entry {item!r}: expected N.M, N.Ma, N.Mf (optionally +PTX)")
        num = f"{m[1]}{m[2]}{m[3]}"
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags
