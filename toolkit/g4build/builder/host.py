"""What this machine has (cores, RAM, disk, compilers): probed once at the edge, checked by a pure function."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from g4build.builder.plan import BuildPlan
from g4build.builder.probe import Probe, SystemProbe
from g4build.errors import BuildError, UsageError

MIN_FREE_GB = 30.0  # vLLM's build tree, objects and wheels for one arch, with room to spare


@dataclass(frozen=True, kw_only=True)
class HostFacts:
    os: str  # windows | wsl | linux
    cores: int
    mem_gb: float
    free_gb: float  # at the build root (or its nearest existing parent)
    nvcc: str | None  # path
    nvcc_version: str | None
    cxx: str | None  # g++ / cl.exe
    launcher: str | None  # sccache / ccache


def host_os() -> str:
    plat: str = sys.platform  # a plain str: mypy must not narrow it to this machine's platform
    if plat == "win32":
        return "windows"
    if plat.startswith("linux"):
        try:
            if "microsoft" in Path("/proc/version").read_text().lower():
                return "wsl"
        except OSError:
            pass
        return "linux"
    return plat


UNKNOWN_MEM_GB = 16.0  # when the machine does not say: 3 jobs, slow but safe


def mem_gb(system: Probe) -> float:
    """Installed RAM in GB as the machine reports it (sysconf; GlobalMemoryStatusEx on Windows, where sysconf
    does not exist)."""
    total = system.memory_bytes()
    return total / 1e9 if total else UNKNOWN_MEM_GB


def nvcc_version(nvcc: str) -> str | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+\.\d+)", out)
    return m[1] if m else None


def cuda_home_of(nvcc: str) -> str:
    """The CUDA install an nvcc belongs to: CUDA_HOME / CUDA_PATH when set, else nvcc's own ``TOP`` (so a
    wrapper script such as ``/usr/local/bin/nvcc`` that execs the real one still names the real toolkit)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    try:
        dry = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-E", os.devnull],
                             capture_output=True, text=True, timeout=60, check=False)
        m = re.search(r"^#\$ TOP=(.+?)\s*$", dry.stdout + dry.stderr, re.M)
        if m:
            return str(Path(m.group(1)).resolve())
    except (OSError, subprocess.TimeoutExpired):
        pass
    return str(Path(nvcc).resolve().parent.parent)


def find_nvcc() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home:
            cand = Path(home) / "bin" / ("nvcc.exe" if sys.platform == "win32" else "nvcc")
            if cand.is_file():
                return str(cand)
    return shutil.which("nvcc")


def probe(root: str, system: Probe | None = None) -> HostFacts:
    """This machine's facts; ``system`` (a builder.probe Probe; default: the real one) answers the OS questions."""
    system = system or SystemProbe()
    where = Path(root)
    while not where.exists() and where != where.parent:
        where = where.parent
    nvcc = find_nvcc()
    cxx = shutil.which("cl") or shutil.which("g++") or shutil.which("c++")
    if cxx is None and host_os() == "windows":  # cl.exe appears on PATH only after vcvars64; vswhere finds it
        vswhere = Path(os.environ.get("PROGRAMFILES(X86)", "")) / "Microsoft Visual Studio" / "Installer" / \
            "vswhere.exe"
        cxx = str(vswhere) if vswhere.is_file() else None
    return HostFacts(
        os=host_os(),
        cores=system.cpu_count() or 1,
        mem_gb=mem_gb(system),
        free_gb=shutil.disk_usage(where).free / 1e9,
        nvcc=nvcc,
        nvcc_version=nvcc_version(nvcc) if nvcc else None,
        cxx=cxx,
        launcher=(shutil.which("sccache") and "sccache") or (shutil.which("ccache") and "ccache"),
    )


def preflight(plan: BuildPlan, host: HostFacts, *, min_free_gb: float = MIN_FREE_GB, at: str | None = None) -> None:
    """Refuse to start a build this machine cannot finish. Pure: every fact comes in ``host`` (its free disk
    measured at ``at``, default the plan's build root)."""
    t = plan.target
    if t.executor == "native" and host.os != t.os:  # the options, not the machine, are wrong: a usage error
        raise UsageError(f"a native build for {t.os} must run on {t.os}; this machine is {host.os}",
                         hint="use --emit-script to get a script for that machine, or --dry-run to read the plan")
    if t.executor == "native":
        if not host.nvcc or not host.nvcc_version:
            raise BuildError(f"nvcc not found: expected CUDA {t.cuda} (set CUDA_HOME or put nvcc on PATH)",
                             hint=f"install the CUDA {t.cuda} toolkit")
        if Version(host.nvcc_version) < Version(t.cuda):
            raise BuildError(f"nvcc at {host.nvcc} is CUDA {host.nvcc_version}: expected CUDA >= {t.cuda}",
                             hint=f"put CUDA {t.cuda}'s bin first on PATH or pass --cuda {host.nvcc_version}")
        if not host.cxx:
            what = "MSVC (cl.exe)" if t.os == "windows" else "a C++ compiler (g++)"
            raise BuildError(f"{what} not found: nvcc needs a host compiler",
                             hint="install Visual Studio Build Tools" if t.os == "windows"
                             else "install g++ (apt-get install build-essential)")
    if host.free_gb < min_free_gb:
        raise BuildError(f"{host.free_gb:.1f} GB free at {at or plan.layout.root}: expected at least "
                         f"{min_free_gb:.0f} GB",
                         hint="free disk space or choose another --root")
