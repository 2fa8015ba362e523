"""`g4build doctor` against recorded outputs of nvidia-smi, nvcc, vswhere and a torch import on five machines."""

from __future__ import annotations

import pytest
from tests.unit.doctor.recorded import FIXTURES, RecordedProbe

from g4build.doctor import DoctorReport, Finding, run_doctor
from g4build.doctor.checks import (
    TORCH_SCRIPT,
    parse_meminfo,
    parse_nvcc_version,
    parse_nvidia_smi,
    suggested_max_jobs,
)


def _run(scenario: str, *, python: str = "python3", workdir: str = "/home/dev/g4build") -> tuple[
        DoctorReport, dict[str, Finding], RecordedProbe]:
    probe = RecordedProbe(scenario)
    report = run_doctor(probe, python=python, pin_torch="2.11.0", workdir=workdir)
    checks = [f.check for f in report.findings if f.check != "gpu"]
    assert len(checks) == len(set(checks)), f"a check reported twice: {checks}"
    return report, {f.check: f for f in report.findings}, probe


def _status(found: dict[str, Finding]) -> dict[str, str]:
    return {name: f.status for name, f in found.items()}


def test_windows_rtx5090_with_cuda_12_9() -> None:
    report, found, probe = _run("windows-5090-cuda129", python=r"C:\venvs\g4\Scripts\python.exe",
                                workdir=r"C:\b\g4build")
    assert _status(found) == {
        "platform": "ok", "gpu": "ok", "driver": "warn", "cuda": "ok", "flashinfer-cuda": "warn", "git": "ok",
        "msvc": "ok", "long-paths": "fail", "python": "ok", "torch": "ok", "memory": "ok", "disk": "ok", "docker": "ok",
        "compiler-cache": "ok",
    }
    assert found["gpu"].summary == "GPU 0: NVIDIA GeForce RTX 5090, SM120 detected"
    assert found["driver"].summary == "driver 576.88 runs CUDA 12.x builds only"
    assert "TORCH_CUDA_ARCH_LIST=12.0a" in found["cuda"].summary  # CUDA < 13: the arch-specific target
    assert found["msvc"].summary == "Visual Studio Build Tools 2022 17.14.36310.24"
    assert found["git"].summary == "git 2.47.1" and "git-longpaths" not in found  # core.longpaths is on
    assert "LongPathsEnabled /t REG_DWORD /d 1" in found["long-paths"].fix
    assert found["memory"].summary == ("64 GiB RAM: use MAX_JOBS=13 (69 GB RAM / 5 GB a job, not measured for this "
                                       "build = 13; 32 cores; 13 jobs, bound by the RAM)")
    assert "msvc-alignas" not in found  # only CUDA 13.0-13.2
    assert {f.check for f in report.failed} == {"long-paths"}  # the build script stops on it before cloning
    assert ("run", r"C:\Program Files (x86)\Microsoft Visual Studio\Installer\vswhere.exe", "-products",
            "*", "-requires", "Microsoft.VisualStudio.Component.VC.Tools.x86.x64", "-format", "json",
            "-utf8") in probe.calls
    assert ("run", r"C:\venvs\g4\Scripts\python.exe", "-c", TORCH_SCRIPT) in probe.calls


def test_windows_cuda_13_0_vs2019_no_torch_little_disk() -> None:
    report, found, _ = _run("windows-cuda130-vs2019", python="python")
    assert _status(found) == {
        "platform": "ok", "gpu": "ok", "driver": "ok", "cuda": "ok", "flashinfer-cuda": "warn",
        "msvc-alignas": "warn", "git": "ok", "git-longpaths": "fail", "msvc": "fail", "long-paths": "ok",
        "python": "ok", "torch": "fail",
        "memory": "ok", "disk": "fail", "docker": "warn",
        "compiler-cache": "ok",
    }
    assert found["gpu"].summary == "GPU 0: NVIDIA GeForce RTX 5090, SM120 detected"  # found under NVSMI
    assert found["msvc-alignas"].summary == "CUDA 13.0 with MSVC hits the alignas(128) error in cuda.h"
    assert found["msvc-alignas"].fix.startswith(
        r"C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA\v13.0\include\cuda.h aligns CUtensorMap to 128 bytes. "
        "A g4build build handles it itself (its cuda-shim step); to cover run-time JIT too")
    assert found["msvc"].summary.startswith("Visual Studio Community 2019 16.11")
    assert "No module named 'torch'" in found["torch"].summary and "2.11.0" in found["torch"].fix
    assert found["disk"].summary.startswith("12 GiB free")
    # the build takes VS 2022 only and stops without git's long paths
    assert {f.check for f in report.failed} == {"torch", "disk", "msvc", "git-longpaths"}
    assert found["git-longpaths"].fix == "git config --global core.longpaths true"
    # one clear line, not the SDK's nested tuple
    assert found["docker"].summary == ("Docker engine not reachable: no Docker engine socket or pipe here (Docker is "
                                       "not installed or not started)")
    assert "start Docker" in found["docker"].fix


def test_wsl_rtx5090_cuda_13() -> None:
    report, found, probe = _run("wsl-5090", workdir="/mnt/c/src/g4build")
    assert _status(found) == {
        "platform": "ok", "wsl-filesystem": "warn", "gpu": "ok", "driver": "ok", "cuda": "ok",
        "flashinfer-cuda": "ok", "git": "ok", "python": "ok", "torch": "ok", "memory": "warn", "disk": "ok",
        "docker": "warn",
        "compiler-cache": "ok",
    }
    assert found["platform"].summary == "WSL2 (Ubuntu-24.04)"
    assert found["compiler-cache"].summary == (
        "sccache 0.10.0: units kept in S3-compatible bucket g4-cache (endpoint http://nas.local:9000, region auto) "
        "(shared with every machine using it)")
    assert "TORCH_CUDA_ARCH_LIST=12.0f" in found["cuda"].summary and found["cuda"].detail["version"] == "13.0"
    assert found["memory"].summary == "MAX_JOBS=16 with 31 GiB RAM risks the compiler being 'Killed'"
    assert found["memory"].fix == (r"set MAX_JOBS=6 (raise memory= in %UserProfile%\.wslconfig) (34 GB RAM / 5 GB "
                                   "a job, not measured for this build = 6; 24 cores; 6 jobs, bound by the RAM)")
    assert not any(c[0] == "registry" for c in probe.calls), "no registry outside Windows"
    assert found["cuda"].detail["nvcc"] == "/usr/local/cuda/bin/nvcc"  # not on PATH in this WSL
    assert ("run", "/usr/lib/wsl/lib/nvidia-smi", "--query-gpu=name,compute_cap,driver_version",
            "--format=csv,noheader") in probe.calls
    assert not report.failed


def test_old_linux_machine_fails_on_cuda_python_and_torch() -> None:
    report, found, _ = _run("linux-ada-old")
    assert _status(found) == {
        "platform": "ok", "gpu": "warn", "driver": "warn", "cuda": "fail", "flashinfer-cuda": "warn",
        "git": "warn", "python": "fail", "torch": "fail", "torch-pin": "warn", "memory": "warn", "disk": "warn",
        "docker": "ok",
        "compiler-cache": "warn",
    }
    assert found["gpu"].summary == "GPU 0: NVIDIA GeForce RTX 4090 is SM89, not SM120"
    assert "no sccache or ccache" in found["compiler-cache"].summary and "sccache" in found["compiler-cache"].fix
    assert found["cuda"].summary == "CUDA 12.4 cannot compile for sm_120"
    assert found["git"].summary == "git 2.17.1 is older than 2.25 (or not understood)"
    assert found["torch"].summary == "torch 2.5.1+cu124 is built for CUDA 12.4: no Blackwell (sm_120) support"
    assert found["memory"].summary == ("8 GiB RAM: MAX_JOBS=1, a slow build (9 GB RAM / 5 GB a job, not measured "
                                       "for this build = 1; 64 cores; 1 job, bound by the RAM)")  # the cgroup limit
    assert {f.check for f in report.failed} == {"cuda", "python", "torch"}


def test_driver_down_and_nvcc_only_under_cuda_home() -> None:
    _, found, probe = _run("linux-driver-down")
    assert found["gpu"].status == "warn"
    assert found["gpu"].summary.startswith("nvidia-smi found no GPU: NVIDIA-SMI has failed")
    assert "R580" in found["gpu"].fix and "R570" not in found["gpu"].fix  # README: R580 (CUDA 13)
    assert "driver" not in found
    assert found["cuda"].status == "ok" and found["cuda"].detail["nvcc"] == "/usr/local/cuda-12.8/bin/nvcc"
    assert found["flashinfer-cuda"].status == "warn"
    assert found["torch"].status == "fail" and found["torch"].summary == "torch 2.11.0+cpu is a CPU-only build"
    assert ("run", "/usr/local/cuda-12.8/bin/nvcc", "--version") in probe.calls
    assert found["git"].status == "fail" and found["git"].fix.startswith("install git")


def test_a_blackwell_gpu_on_an_old_driver_fails() -> None:
    from g4build.doctor.checks import _check_driver

    gpus = parse_nvidia_smi("NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 565.57.01\n")
    finding = _check_driver(gpus)
    assert finding.status == "fail" and "too old for Blackwell" in finding.summary


def test_parsers() -> None:
    two = parse_nvidia_smi("NVIDIA GeForce RTX 5090, 12.0, 581.57\nNVIDIA GB10, 12.1, 580.95.05\n")
    assert [(g.name, g.compute_cap, g.driver) for g in two] == [
        ("NVIDIA GeForce RTX 5090", "12.0", "581.57"), ("NVIDIA GB10", "12.1", "580.95.05")]
    assert parse_nvidia_smi("No devices were found\n") == []
    assert str(parse_nvcc_version((FIXTURES / "wsl-5090" / "nvcc.txt").read_text())) == "13.0"
    assert parse_nvcc_version("bash: nvcc: command not found") is None
    assert parse_meminfo((FIXTURES / "wsl-5090" / "meminfo.txt").read_text()) == 32794884 * 1024
    assert suggested_max_jobs(64 * 2**30, 8) == 8 and suggested_max_jobs(3 * 2**30, 8) == 1


@pytest.mark.parametrize("scenario", sorted(p.name for p in FIXTURES.iterdir()))
def test_every_finding_that_is_not_ok_says_the_fix(scenario: str) -> None:
    report, _, _ = _run(scenario)
    for f in report.findings:
        assert f.status == "ok" or f.fix, f"{f.check} is {f.status} without a fix"


def test_msvc_takes_visual_studio_2022_beside_a_newer_one() -> None:
    from g4build.doctor.checks import check_msvc

    [both] = check_msvc(RecordedProbe("windows-vs2026-beside-2022"))
    assert both.status == "ok" and both.detail["version"] == "17.14.36310.24"
    assert both.summary == ("Visual Studio Build Tools 2022 17.14.36310.24 (the build uses it, not Visual Studio "
                            "Community 2026 18.0.11222.15)")
    [newer] = check_msvc(RecordedProbe("windows-vs2026-only"))
    assert newer.status == "fail"
    assert newer.summary.startswith("Visual Studio Community 2026 18.0.11222.15: CUDA 12.8-13.0 support the MSVC "
                                    "of Visual Studio 2022")
    assert "Visual Studio 2022 Build Tools" in newer.fix and "Desktop development with C++" in newer.fix


def test_windows_cuda_13_0_header_patched_by_the_forks_script_is_ok() -> None:
    """The installed header decides: once the fork's fix_cuda_13_align.py has run, run-time JIT is covered too."""

    class Patched(RecordedProbe):
        def read_text(self, path: str) -> str | None:
            text = super().read_text(path)
            if text is None:
                return None
            block = ("#if defined(_MSC_VER)\n  #define TENSOR_MAP_ALIGN 64\n#else\n  #define TENSOR_MAP_ALIGN 128\n"
                     "#endif\n")
            text = text.replace("typedef struct CUtensorMap_st {", block + "typedef struct CUtensorMap_st {")
            return text.replace("lignas(128)", "lignas(TENSOR_MAP_ALIGN)")  # alignas and _Alignas

    report = run_doctor(Patched("windows-cuda130-vs2019"), python="python", pin_torch="2.11.0", workdir="C:\\b")
    found = {f.check: f for f in report.findings}
    assert found["msvc-alignas"].status == "ok"
    assert found["msvc-alignas"].summary == ("CUDA 13.0 cuda.h is fit for MSVC: CUtensorMap is aligned through "
                                             "TENSOR_MAP_ALIGN, 64 under MSVC (patched by fix_cuda_13_align.py)")


def test_memory_says_the_measured_figure_it_uses() -> None:
    """The build route's MAX_JOBS with the pin's measured peak per nvcc job: the 64 GiB, 32-thread desktop gets
    15 jobs (the 16-job build peaked at 58.4 GB) where 5 GB a job gave 13, and the line says the RAM, the figure
    with its source, and the cores."""
    from g4build.builder.buildcosts import load_costs
    from g4build.data import patches_dir
    from g4build.doctor.checks import check_memory

    costs = load_costs(patches_dir(), "vllm-0.21.0", "sm120")
    [found] = check_memory(RecordedProbe("windows-5090-cuda129"), False, costs)
    assert found.summary == ("64 GiB RAM: use MAX_JOBS=15 (69 GB RAM / 4.6 GB a job, measured for vllm-0.21.0 "
                             "sm120: peak 58.4 GB at 16 jobs, x1.25 margin = 15; 32 cores; 15 jobs, bound by the RAM)")
    assert found.detail["max_jobs"] == 15 and found.detail["gb_per_job"] == 4.56 and found.detail["cores"] == 32
    report = run_doctor(RecordedProbe("windows-5090-cuda129"), python="python3", pin_torch="2.11.0", costs=costs)
    assert {f.check: f for f in report.findings}["memory"].summary == found.summary
