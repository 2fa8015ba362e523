"""What a build plan asks of the machine before its first step, and how long and how much disk it takes.

The emitted Windows script checks Visual Studio, CUDA, long paths and the venv as it starts; a `--dry-run` plan
says the same up front, so a user installs them before copying the script over. The estimate comes from a
measured build per kernel profile (issue "A desktop's build": the sm_120 vLLM wheel's 169 compile units took
18,094 CPU-seconds on Linux, 801 s on 32 cores; with ``--kernels gemma4`` its 117 units took 12,442 on 16 cores,
912 s for the whole command); MSVC builds are not measured, so Windows is given as the same work, said to be
likely slower.
"""

from __future__ import annotations

from g4build.builder.host import MIN_FREE_GB
from g4build.builder.plan import Options, Target
from g4build.builder.platforms.windows import GIT_LONG_PATHS_FIX, LONG_PATHS_FIX
from g4build.pins.model import Pin

# the measured sm_120 vLLM wheel: every nvcc/host unit, summed, per kernel profile (tests/device/results/
# wheel-sm120.json's 32-core run, wheel-sm120-16c.json)
COMPILE_CPU_SECONDS = {"all": 18_094, "gemma4": 12_442}
SETUP_MINUTES = 10  # source fetch, the series, pip's build requirements and the wheel's packing, roughly


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


def estimate(target: Target, opts: Options) -> str:
    """Time and disk for the build, from the measured compile work and MAX_JOBS."""
    work = COMPILE_CPU_SECONDS.get(opts.kernels, COMPILE_CPU_SECONDS["all"])
    minutes = work / max(1, opts.jobs) / 60 + SETUP_MINUTES
    where = " (measured on Linux; MSVC on Windows is likely slower)" if target.os == "windows" else ""
    return (f"about {minutes:.0f} minutes with MAX_JOBS={opts.jobs}: {work:,} CPU-seconds of "
            f"compiling spread over the jobs, plus ~{SETUP_MINUTES} minutes of fetching and installing{where}; "
            f"{MIN_FREE_GB:.0f} GB free at the build root (the build checks it)")
