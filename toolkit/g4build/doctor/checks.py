"""The preflight checks: parse what the tools print, judge it, and say the fix.

Parsers are pure functions of the tools' text; checks turn probe answers into findings. Thresholds come from
what the toolchain needs for SM120: CUDA 12.8 is the first toolkit with sm_120, FlashInfer's ahead-of-time
sm_120 build needs 12.9, Blackwell GPUs need an R570+ driver and CUDA 13 binaries an R580+ driver, and each
nvcc job of a vLLM build takes about 5 GB of RAM.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

from g4build.builder import cudashim
from g4build.builder.buildcosts import BuildCosts, choose_jobs
from g4build.builder.platforms.windows import (
    GIT_LONG_PATHS_FIX,
    LONG_PATHS_FIX,
    LONG_PATHS_KEY,
    VC_TOOLS,
    VS_VERSION_RANGE,
    is_vs2022,
)
from g4build.builder.probe import CommandResult, Probe
from g4build.errors import BuildError

Status = Literal["ok", "warn", "fail"]

CUDA_FOR_SM120 = Version("12.8")
CUDA_FOR_FLASHINFER_SM120 = Version("12.9")
DRIVER_FOR_BLACKWELL = 570
DRIVER_FOR_CUDA13 = 580
GB_PER_NVCC_JOB = 5
DISK_FAIL_GIB = 20
DISK_WARN_GIB = 50
PYTHON_RANGE = (Version("3.10"), Version("3.15"))  # vLLM's requires-python: >=3.10,<3.15 (0.33 wants 3.11+)
WSL_NVIDIA_SMI = "/usr/lib/wsl/lib/nvidia-smi"
LINUX_NVCC = "/usr/local/cuda/bin/nvcc"
VSWHERE = r"Microsoft Visual Studio\Installer\vswhere.exe"  # under %ProgramFiles(x86)%
TORCH_SCRIPT = """\
import json, sys
out = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    try:
        out["archs"] = torch.cuda.get_arch_list()
    except Exception:
        out["archs"] = []
except Exception as exc:
    out["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


@dataclass(frozen=True, kw_only=True)
class Finding:
    check: str
    status: Status
    summary: str
    fix: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Gpu:
    name: str
    compute_cap: str
    driver: str


# --- parsers (pure) ------------------------------------------------------------------------------------------


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Rows of ``--query-gpu=name,compute_cap,driver_version --format=csv,noheader``."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3 and re.fullmatch(r"\d+\.\d+", cells[1]):
            gpus.append(Gpu(name=cells[0], compute_cap=cells[1], driver=cells[2]))
    return gpus


def parse_nvcc_version(text: str) -> Version | None:
    """The toolkit release from ``nvcc --version`` ("Cuda compilation tools, release 13.0, V13.0.88")."""
    m = re.search(r"release (\d+\.\d+)", text)
    return Version(m.group(1)) if m else None


def parse_vswhere(text: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(text or "[]")
    except json.JSONDecodeError:
        return []
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def parse_meminfo(text: str) -> int | None:
    m = re.search(r"^MemTotal:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else None


def is_wsl(proc_version: str | None, distro: str | None) -> bool:
    return bool(distro) or (proc_version is not None and "microsoft" in proc_version.lower())


def suggested_max_jobs(memory_bytes: int, cpus: int | None) -> int:
    by_memory = max(1, memory_bytes // (GB_PER_NVCC_JOB * 10**9))
    return int(min(by_memory, cpus or by_memory))


def _cuda_version(s: str | None) -> Version | None:
    try:
        return Version(s) if s else None
    except InvalidVersion:
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.0f} GiB"


# --- checks -------------------------------------------------------------------------------------------------


def check_gpu(probe: Probe, wsl: bool = False, *, serving: bool = False) -> list[Finding]:
    """The GPUs nvidia-smi lists. None is a warning for a build (it compiles for sm_120 without one) and a failure
    for a serving route (``serving``: overlay, nightly), whose fix speaks of serving."""
    query = ["--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"]
    res = probe.run(["nvidia-smi", *query])
    if res is None and wsl:  # WSL puts the Windows driver's tools here, not always on PATH
        res = probe.run([WSL_NVIDIA_SMI, *query])
    if res is None and probe.system == "windows":  # older Windows drivers install it only here
        program_files = probe.env("ProgramFiles") or r"C:\Program Files"
        res = probe.run([program_files.rstrip("\\") + r"\NVIDIA Corporation\NVSMI\nvidia-smi.exe", *query])
    driver = (f"install the NVIDIA driver R{DRIVER_FOR_CUDA13} or newer (CUDA 13 wheels need it; in WSL: the "
              "Windows driver only, never a Linux one inside WSL)")
    if serving:
        no_gpu_fix = (f"vLLM serves on an NVIDIA GPU (the recipes: SM120, an RTX 5090 class card): {driver}, then "
                      "run doctor again; the other checks above and below ran all the same")
    else:
        no_gpu_fix = ("a build without a GPU still targets sm_120 (TORCH_CUDA_ARCH_LIST), but the wheel cannot be "
                      f"tried here; for a GPU {driver}")
    status: Status = "fail" if serving else "warn"
    if res is None:
        return [Finding(check="gpu", status=status, summary="nvidia-smi not found: no NVIDIA driver visible",
                        fix=no_gpu_fix)]
    gpus = parse_nvidia_smi(res.stdout) if res.returncode == 0 else []
    if not gpus:
        said = (res.stdout.strip() or res.stderr.strip()).splitlines()
        return [Finding(check="gpu", status=status, summary=f"nvidia-smi found no GPU: {said[0] if said else ''}",
                        fix=no_gpu_fix)]
    findings = []
    for i, gpu in enumerate(gpus):
        sm = gpu.compute_cap.replace(".", "")
        detail = {"index": i, "name": gpu.name, "compute_cap": gpu.compute_cap, "driver": gpu.driver}
        if gpu.compute_cap in ("12.0", "12.1"):
            findings.append(Finding(check="gpu", status="ok", summary=f"GPU {i}: {gpu.name}, SM{sm} detected",
                                    detail=detail))
        else:
            findings.append(Finding(
                check="gpu", status="warn", summary=f"GPU {i}: {gpu.name} is SM{sm}, not SM120",
                fix=f"g4build targets sm_120; add {gpu.compute_cap} to TORCH_CUDA_ARCH_LIST to run on this GPU too",
                detail=detail))
    findings.append(_check_driver(gpus))
    return findings


def _check_driver(gpus: Sequence[Gpu]) -> Finding:
    driver = gpus[0].driver
    try:
        major = int(driver.split(".")[0])
    except ValueError:
        return Finding(check="driver", status="warn", summary=f"driver version '{driver}' not understood")
    blackwell = any(Version(g.compute_cap) >= Version("10.0") for g in gpus)
    if blackwell and major < DRIVER_FOR_BLACKWELL:
        return Finding(check="driver", status="fail", summary=f"driver {driver} is too old for Blackwell GPUs",
                       fix=f"install NVIDIA driver R{DRIVER_FOR_CUDA13} or newer", detail={"driver": driver})
    if major < DRIVER_FOR_CUDA13:
        return Finding(check="driver", status="warn", summary=f"driver {driver} runs CUDA 12.x builds only",
                       fix=f"CUDA 13 (cu130) wheels need driver R{DRIVER_FOR_CUDA13}+; update it or use CUDA 12.8/12.9",
                       detail={"driver": driver})
    return Finding(check="driver", status="ok", summary=f"driver {driver} (CUDA 13 capable)", detail={"driver": driver})


def _find_nvcc(probe: Probe) -> tuple[CommandResult | None, str]:
    res = probe.run(["nvcc", "--version"])
    if res is not None:
        return res, "nvcc"
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = probe.env(var)
        if home:
            exe = home.rstrip("/\\") + ("\\bin\\nvcc.exe" if probe.system == "windows" else "/bin/nvcc")
            res = probe.run([exe, "--version"])
            if res is not None:
                return res, exe
    if probe.system == "linux":  # the toolkit's default place, often not on PATH
        res = probe.run([LINUX_NVCC, "--version"])
        if res is not None:
            return res, LINUX_NVCC
    return None, ""



def check_cuda(probe: Probe, wsl: bool) -> list[Finding]:
    res, where = _find_nvcc(probe)
    version = parse_nvcc_version(res.stdout) if res is not None and res.returncode == 0 else None
    if version is None:
        return [Finding(check="cuda", status="fail", summary="no CUDA toolkit: nvcc not found",
                        fix="install the CUDA toolkit 12.8 or newer (13.0 matches the pins) and put its bin on PATH "
                            "or set CUDA_HOME")]
    detail = {"nvcc": where, "version": str(version)}
    arch = "12.0f" if version >= Version("13.0") else "12.0a"
    findings = []
    if version < CUDA_FOR_SM120:
        findings.append(Finding(check="cuda", status="fail", summary=f"CUDA {version} cannot compile for sm_120",
                                fix="install CUDA 12.8 or newer (13.0 matches the pins)", detail=detail))
    else:
        findings.append(Finding(check="cuda", status="ok",
                                summary=f"CUDA {version} compiles sm_120 (use TORCH_CUDA_ARCH_LIST={arch})",
                                detail={**detail, "arch": arch}))
    if version < CUDA_FOR_FLASHINFER_SM120:
        findings.append(Finding(
            check="flashinfer-cuda", status="warn",
            summary=f"CUDA {version} is too old for FlashInfer's ahead-of-time sm_120 build",
            fix="install CUDA 12.9+ to build flashinfer-jit-cache, or let FlashInfer JIT at run time"))
    elif probe.system == "windows":
        findings.append(Finding(check="flashinfer-cuda", status="warn",
                                summary="FlashInfer's ahead-of-time build is Linux only",
                                fix="build with Windows FlashInfer wheels of the pin's version (g4build wheel "
                                    "--flashinfer-wheel PATH=SHA256), or serve without FlashInfer: the launch "
                                    "scripts then turn its paths off"))
    else:
        findings.append(Finding(
            check="flashinfer-cuda", status="ok",
            summary=f"CUDA {version} builds FlashInfer for sm_120 (FLASHINFER_CUDA_ARCH_LIST={arch})"))
    if probe.system == "windows" and not wsl and Version("13.0") <= version < Version("13.3"):
        findings.append(_msvc_alignas(probe, where, version))
    return findings


def _cuda_header(probe: Probe, nvcc: str, version: Version) -> str | None:
    """Where the installed cuda.h of the nvcc found is: beside its bin folder, else the CUDA install variables."""
    if nvcc.lower().endswith("\\bin\\nvcc.exe"):
        return nvcc[: -len("\\bin\\nvcc.exe")] + "\\include\\cuda.h"
    for var in (f"CUDA_PATH_V{version.major}_{version.minor}", "CUDA_HOME", "CUDA_PATH"):
        home = probe.env(var)
        if home:
            return home.rstrip("/\\") + "\\include\\cuda.h"
    return None


def _msvc_alignas(probe: Probe, nvcc: str, version: Version) -> Finding:
    """CUDA 13.0-13.2 with MSVC: g4build's build brings its own cuda.h copy, but run-time JIT (FlashInfer, torch
    extensions) reads the installed one, so the installed header decides whether this is settled."""
    header = _cuda_header(probe, nvcc, version)
    text = probe.read_text(header) if header else None
    state = None
    if text is not None:
        try:
            state = cudashim.inspect(text, header or "cuda.h")
        except BuildError:
            state = None
    if state is not None and not state.needs_shim:
        return Finding(check="msvc-alignas", status="ok", detail={"header": header},
                       summary=f"CUDA {version} cuda.h is fit for MSVC: {state.how}")
    read = f"{header} aligns CUtensorMap to 128 bytes" if state is not None else "the installed cuda.h was not read"
    return Finding(
        check="msvc-alignas", status="warn", detail={"header": header},
        summary=f"CUDA {version} with MSVC hits the alignas(128) error in cuda.h",
        fix=f"{read}. A g4build build handles it itself (its cuda-shim step); {cudashim.FIX_INSTALLED}")


def check_python_and_torch(probe: Probe, python: str, pin_torch: str | None) -> list[Finding]:
    res = probe.run([python, "-c", TORCH_SCRIPT], timeout=180.0)
    try:
        info = json.loads(res.stdout.strip().splitlines()[-1]) if res is not None and res.stdout.strip() else None
    except json.JSONDecodeError:
        info = None
    if not isinstance(info, dict):
        err = res.stderr.strip().splitlines()[-1:] if res is not None else ["not found"]
        return [Finding(check="python", status="fail", summary=f"cannot run {python}: {' '.join(err)}",
                        fix="pass the Python you build with: g4build doctor --python PATH")]
    findings = [_python_finding(str(info.get("python", "")), str(info.get("executable", python)))]
    if "torch" not in info:
        findings.append(Finding(
            check="torch", status="fail", summary=f"torch is not importable: {info.get('torch_error', '')}".strip(),
            fix=f"install torch {pin_torch or ''} built for CUDA 12.8+ (a cu128/cu129/cu130 wheel)".replace("  ", " ")))
        return findings
    torch_v, cuda = str(info["torch"]), _cuda_version(info.get("cuda"))
    archs = [str(a) for a in info.get("archs") or []]
    detail = {"torch": torch_v, "cuda": str(cuda) if cuda else None, "archs": archs}
    if cuda is None:
        findings.append(Finding(check="torch", status="fail", summary=f"torch {torch_v} is a CPU-only build",
                                fix="install a CUDA build of torch: cu128 or newer (cu130 matches the pins)",
                                detail=detail))
    elif cuda < CUDA_FOR_SM120:
        findings.append(Finding(check="torch", status="fail",
                                summary=f"torch {torch_v} is built for CUDA {cuda}: no Blackwell (sm_120) support",
                                fix="install a cu128 or newer torch build", detail=detail))
    elif archs and not any(a in ("sm_120", "compute_120") for a in archs):
        findings.append(Finding(check="torch", status="warn",
                                summary=f"torch {torch_v} (CUDA {cuda}) lists no sm_120 kernels",
                                fix="install the official cu128+ torch wheel", detail=detail))
    else:
        findings.append(Finding(check="torch", status="ok", summary=f"torch {torch_v} with CUDA {cuda}",
                                detail=detail))
    if pin_torch and Version(torch_v.split("+")[0]).base_version != Version(pin_torch).base_version:
        findings.append(Finding(check="torch-pin", status="warn",
                                summary=f"the pin builds against torch {pin_torch}, found {torch_v}",
                                fix=f"install torch {pin_torch}, or build with the installed one (use_existing_torch)"))
    return findings


def _python_finding(version: str, executable: str) -> Finding:
    try:
        v = Version(version)
    except InvalidVersion:
        return Finding(check="python", status="warn", summary=f"Python version '{version}' not understood")
    low, high = PYTHON_RANGE
    detail = {"version": version, "executable": executable}
    if not low <= v < high:
        return Finding(check="python", status="fail", summary=f"Python {version} is outside vLLM's >=3.10,<3.15",
                       fix="use Python 3.12 (3.10-3.14 work)", detail=detail)
    return Finding(check="python", status="ok", summary=f"Python {version}", detail=detail)


MIN_GIT = Version("2.25")


def parse_git_version(text: str) -> Version | None:
    m = re.search(r"git version (\d+\.\d+(?:\.\d+)?)", text)
    return Version(m.group(1)) if m else None


def check_git(probe: Probe) -> list[Finding]:
    """Sources are git trees, patches go in with git apply, the Windows base is merged with git merge-file."""
    windows = probe.system == "windows"
    install = "winget install Git.Git" if windows else "install git (e.g. apt install git)"
    res = probe.run(["git", "--version"])
    if res is None or res.returncode:
        return [Finding(check="git", status="fail", summary="git not found: g4build keeps sources as git trees",
                        fix=install)]
    version = parse_git_version(res.stdout)
    if version is None or version < MIN_GIT:
        said = str(version) if version else repr(res.stdout.strip())
        return [Finding(check="git", status="warn", summary=f"git {said} is older than {MIN_GIT} (or not understood)",
                        fix=f"update git ({install})")]
    findings = [Finding(check="git", status="ok", summary=f"git {version}", detail={"version": str(version)})]
    if windows:
        longpaths = probe.run(["git", "config", "--global", "--get", "core.longpaths"])
        if longpaths is None or longpaths.stdout.strip().lower() != "true":
            findings.append(Finding(  # a fail: the Windows build script stops on it before the first clone
                check="git-longpaths", status="fail",
                summary="git core.longpaths is off: CUTLASS and FlashInfer checkouts have paths past 260 characters",
                fix=GIT_LONG_PATHS_FIX))
    return findings


def check_msvc(probe: Probe) -> list[Finding]:
    """Visual Studio 2022 (17.x) with the C++ x64 tools, picked as the build picks it: CUDA 13.0 supports that
    MSVC only, so a newer Visual Studio alone fails, and one beside a 2022 is fine (the build takes the 2022)."""
    program_files = probe.env("ProgramFiles(x86)") or r"C:\Program Files (x86)"
    # every instance (no -latest): which one the build takes is decided below, by version
    res = probe.run([program_files.rstrip("\\") + "\\" + VSWHERE, "-products", "*", "-requires", VC_TOOLS,
                     "-format", "json", "-utf8"])
    instances = parse_vswhere(res.stdout) if res is not None and res.returncode == 0 else []
    install = "install Visual Studio 2022 Build Tools with the 'Desktop development with C++' workload"
    if not instances:
        return [Finding(check="msvc", status="fail", summary="no Visual Studio with the C++ x64 tools",
                        fix=install)]

    def version(vs: dict[str, Any]) -> str:
        return str(vs.get("installationVersion", "?"))

    def describe(vs: dict[str, Any]) -> str:
        return f"{vs.get('displayName', 'Visual Studio')} {version(vs)}"

    vs2022 = sorted((vs for vs in instances if is_vs2022(version(vs))), key=lambda vs: Version(version(vs)))
    if vs2022:
        vs = vs2022[-1]
        others = [describe(o) for o in instances if not is_vs2022(version(o))]
        detail = {"name": vs.get("displayName"), "version": version(vs), "path": vs.get("installationPath"),
                  "ignored": others}
        return [Finding(check="msvc", status="ok", summary=describe(vs)
                        + (f" (the build uses it, not {', '.join(others)})" if others else ""), detail=detail)]
    found = ", ".join(describe(vs) for vs in instances)
    return [Finding(check="msvc", status="fail",
                    summary=f"{found}: CUDA 12.8-13.0 support the MSVC of Visual Studio 2022 (vswhere -version "
                            f"{VS_VERSION_RANGE}) only",
                    fix=install + " (the other Visual Studio may stay)",
                    detail={"found": [version(vs) for vs in instances]})]


def check_long_paths(probe: Probe) -> list[Finding]:
    value = probe.registry_dword(LONG_PATHS_KEY, "LongPathsEnabled")
    if value == 1:
        return [Finding(check="long-paths", status="ok", summary="long paths are enabled")]
    # a fail: the Windows build script stops on it before the first clone
    return [Finding(check="long-paths", status="fail", summary="long paths are disabled (260-character limit)",
                    fix=f"as administrator: {LONG_PATHS_FIX}; and build from a short folder such as C:\\b")]


def check_platform(probe: Probe, workdir: str) -> tuple[list[Finding], bool]:
    distro = probe.env("WSL_DISTRO_NAME")
    wsl = probe.system == "linux" and is_wsl(probe.read_text("/proc/version"), distro)
    if probe.system == "windows":
        return [Finding(check="platform", status="ok", summary="Windows (native build)")], False
    if not wsl:
        return [Finding(check="platform", status="ok", summary=f"{probe.system.capitalize()} (native)")], False
    findings = [Finding(check="platform", status="ok", summary=f"WSL2 ({distro or 'distro unknown'})",
                        detail={"wsl": True, "distro": distro})]
    if re.match(r"^/mnt/[a-z]/", workdir.replace("\\", "/")):
        findings.append(Finding(check="wsl-filesystem", status="warn",
                                summary=f"{workdir} is on the Windows drive: builds there are very slow",
                                fix="build inside the Linux filesystem, e.g. ~/g4build"))
    return findings, True


def check_memory(probe: Probe, wsl: bool, costs: BuildCosts | None = None) -> list[Finding]:
    """RAM and the MAX_JOBS a build here gets: the RAM over the peak per nvcc job measured for the pin and arch
    (``costs``; 5 GB when not measured), at most the cores; the summary says the figures it came from."""
    total = None
    if probe.system == "linux":
        meminfo = probe.read_text("/proc/meminfo")
        total = parse_meminfo(meminfo) if meminfo else None
        limit = (probe.read_text("/sys/fs/cgroup/memory.max") or "").strip()
        if total is not None and limit.isdigit():
            total = min(total, int(limit))
    total = total or probe.memory_bytes()
    if total is None:
        return [Finding(check="memory", status="warn", summary="RAM size unknown",
                        fix="set MAX_JOBS by hand (~5 GB each)")]
    cpus = probe.cpu_count()
    choice = choose_jobs(mem_gb=total / 1e9, cores=cpus, costs=costs)
    jobs = choice.jobs
    detail = {"bytes": total, "max_jobs": jobs, "gb_per_job": round(choice.gb_per_job, 2), "cores": cpus,
              "why": choice.why}
    where = " (raise memory= in %UserProfile%\\.wslconfig)" if wsl else ""
    set_jobs = probe.env("MAX_JOBS")
    if set_jobs and set_jobs.isdigit() and int(set_jobs) > jobs:
        return [Finding(check="memory", status="warn",
                        summary=f"MAX_JOBS={set_jobs} with {_gib(total)} RAM risks the compiler being 'Killed'",
                        fix=f"set MAX_JOBS={jobs}{where} ({choice.why})", detail=detail)]
    if total < 16 * 2**30:
        return [Finding(check="memory", status="warn",
                        summary=f"{_gib(total)} RAM: MAX_JOBS={jobs}, a slow build ({choice.why})",
                        fix=f"more RAM shortens the build{where}", detail=detail)]
    return [Finding(check="memory", status="ok", summary=f"{_gib(total)} RAM: use MAX_JOBS={jobs} ({choice.why})",
                    detail=detail)]


def check_disk(probe: Probe, workdir: str) -> list[Finding]:
    free = probe.free_disk_bytes(workdir)
    if free is None:
        return [Finding(check="disk", status="warn", summary=f"free space at {workdir} unknown")]
    detail = {"path": workdir, "free_bytes": free}
    fix = f"a vLLM build with its sources and caches needs ~{DISK_WARN_GIB} GiB: free space or build elsewhere"
    if free < DISK_FAIL_GIB * 2**30:
        return [Finding(check="disk", status="fail", summary=f"{_gib(free)} free at {workdir}", fix=fix, detail=detail)]
    if free < DISK_WARN_GIB * 2**30:
        return [Finding(check="disk", status="warn", summary=f"{_gib(free)} free at {workdir}", fix=fix, detail=detail)]
    return [Finding(check="disk", status="ok", summary=f"{_gib(free)} free at {workdir}", detail=detail)]

