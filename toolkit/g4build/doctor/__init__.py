"""`g4build doctor`: a preflight before a two-hour build. Each finding is ok / warn / fail with its fix."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from g4build.builder.probe import CommandResult, Probe, SystemProbe
from g4build.doctor.checks import (
    Finding,
    check_cuda,
    check_disk,
    check_git,
    check_gpu,
    check_long_paths,
    check_memory,
    check_msvc,
    check_platform,
    check_python_and_torch,
)
from g4build.doctor.compilercache import check_compiler_cache
from g4build.doctor.docker import check_docker
from g4build.doctor.serving import check_serving
from g4build.pins.model import Pin


@dataclass(frozen=True, kw_only=True)
class DoctorReport:
    findings: tuple[Finding, ...]

    @property
    def failed(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "fail")

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "warn")

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.failed,
            "findings": [
                {"check": f.check, "status": f.status, "summary": f.summary, "fix": f.fix, "detail": f.detail}
                for f in self.findings
            ],
        }


def run_doctor(
    probe: Probe,
    *,
    python: str | None = None,
    pin_torch: str | None = None,
    pin: Pin | None = None,
    workdir: str = ".",
    step: Callable[[str], None] | None = None,
) -> DoctorReport:
    """Run every check that applies to this system, in the order a user fixes them."""
    say = step or (lambda _name: None)
    findings: list[Finding] = []
    say("platform")
    platform_findings, wsl = check_platform(probe, workdir)
    findings += platform_findings
    say("GPU (nvidia-smi)")
    findings += check_gpu(probe, wsl)
    say("CUDA toolkit (nvcc)")
    findings += check_cuda(probe, wsl)
    say("git")
    findings += check_git(probe)
    if probe.system == "windows":
        say("Visual Studio (vswhere)")
        findings += check_msvc(probe)
        findings += check_long_paths(probe)
    say("Python and torch")
    findings += check_python_and_torch(probe, python or sys.executable, pin_torch)
    if pin is not None:  # the environment the pin's vLLM serves in (what the launch scripts check too)
        findings += check_serving(probe, python or sys.executable, pin)
    say("memory and disk")
    findings += check_memory(probe, wsl)
    findings += check_disk(probe, workdir)
    say("compiler cache")
    findings += check_compiler_cache(probe)
    say("Docker engine")
    findings += check_docker(probe)
    return DoctorReport(findings=tuple(findings))


__all__ = ["CommandResult", "DoctorReport", "Finding", "Probe", "SystemProbe", "run_doctor"]
