"""What a build plan asks of the machine before its first step, and how long and how much disk it takes.

The emitted Windows script checks Visual Studio, CUDA, long paths and the venv as it starts; a `--dry-run` plan
says the same up front, so a user installs them before copying the script over. The estimate comes from a
measured build per kernel profile (issue "A desktop's build": the sm_120 vLLM wheel's 169 compile units took
18,094 CPU-seconds on Linux, 801 s on 32 cores; with ``--kernels gemma4`` its 117 units took 12,442 on 16 cores,
912 s for the whole command, and 543 s on 32), packed on the jobs as those builds were; MSVC builds are not
measured, so Windows is given as the same work, said to be likely slower.
"""

from __future__ import annotations

from g4build.builder.host import MIN_FREE_GB
from g4build.builder.plan import Options, Target
from g4build.builder.platforms.windows import GIT_LONG_PATHS_FIX, LONG_PATHS_FIX
from g4build.pins.model import Pin

# the measured sm_120 vLLM wheel: every nvcc/host unit, summed, per kernel profile (tests/device/results/
# wheel-sm120.json's 32-core run, wheel-sm120-16c.json)
COMPILE_CPU_SECONDS = {"all": 18_094, "gemma4": 12_442}
# no job count builds faster than a profile's longest unit: FlashAttention 2's split forward, hdim 128 (gemma4) or
# hdim 64 (every head dim: 333-341 s on the 32-core run)
LONGEST_UNIT_S = {"all": 341, "gemma4": 310}
# ninja's span over that packing bound with the long units first: gemma4 1.03 on 16 cores and 1.10 on 32; the whole
# set 1.08 (the 64-core run beside a second build), so 1.10 for it
SPAN_OVER_BOUND = {"all": 1.10, "gemma4": 1.05}
REST_S = 130  # fitted: each gemma4 build's command less its compile work packed as above (configure, link, pack,
# validate, and what the span factor leaves), 130 s reproducing both within 4%
FETCH = "torch, the pin's sdist and the build requirements"  # a first run's downloads: the network decides


def prerequisites(pin: Pin, target: Target, opts: Options) -> tuple[str, ...]:
    """What to install on the build machine first (Windows; elsewhere `g4build doctor --route build` says)."""
    if target.os != "windows":
        return ()
    return (
        "Visual Studio 2022 (17.x) or its Build Tools with the 'Desktop development with C++' workload (MSVC x64)",
        f"the CUDA {target.cuda} toolkit (nvcc on PATH or CUDA_PATH set), and an NVIDIA driver R580+ to run the wheel",
        f"long paths on: `{LONG_PATHS_FIX}` (admin) and `{GIT_LONG_PATHS_FIX}`",
        f"git, and a virtual environment with Python {target.python} activated (py -{target.python} -m venv "
        "C:\\g4b\\venv; C:\\g4b\\venv\\Scripts\\Activate.ps1) with g4build installed in it "
        f"(python -m pip install .) and torch {pin.torch} for CUDA {target.cuda}",
    )


def _profile(kernels: str) -> str:
    """The measured profile a build's work is counted as (one never measured: the whole set)."""
    return kernels if kernels in COMPILE_CPU_SECONDS else "all"


def estimate_seconds(kernels: str, jobs: int) -> float:
    """The whole command with its downloads cached: the profile's compile work packed on ``jobs`` (never under its
    longest unit), at the span the measured builds had over that bound, plus the fitted rest (gemma4, 16 jobs: 947 s
    against 912 measured; 32: 538 against 543; the whole set on 32: 752 against 801 from a run without the long
    units first)."""
    profile = _profile(kernels)
    packed = max(COMPILE_CPU_SECONDS[profile] / max(1, jobs), LONGEST_UNIT_S[profile])
    return packed * SPAN_OVER_BOUND[profile] + REST_S


def estimate(target: Target, opts: Options) -> str:
    """Time and disk for the build, from the measured compile work and MAX_JOBS."""
    work = COMPILE_CPU_SECONDS[_profile(opts.kernels)]
    minutes = estimate_seconds(opts.kernels, opts.jobs) / 60
    where = " (measured on Linux; MSVC on Windows is likely slower)" if target.os == "windows" else ""
    return (f"about {minutes:.0f} minutes with MAX_JOBS={opts.jobs} once its downloads are cached: {work:,} "
            f"CPU-seconds of compiling spread over the jobs, and ~{REST_S / 60:.0f} minutes of configuring, linking "
            f"and packing{where}; a first run also downloads {FETCH} (minutes, by your network); "
            f"{MIN_FREE_GB:.0f} GB free at the build root (the build checks it)")
