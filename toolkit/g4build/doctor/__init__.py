"""`g4build doctor`: a preflight for the route the user takes. Each finding is ok / warn / fail with its fix.

The build route compiles: it needs the CUDA toolkit, a compiler (Visual Studio on Windows), long paths, RAM for
nvcc jobs, a compiler cache, Docker for its docker executor. The overlay and nightly routes only serve a wheel:
they need the GPU, its driver, Python and the pin's torch and transformers (git too for the overlay, which merges
a fork's files with it); what only a build needs is not checked there, and what only slows one is a warning."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from g4build.builder.buildcosts import BuildCosts
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

ROUTES = ("build", "overlay", "nightly")


@dataclass(frozen=True, kw_only=True)
class DoctorReport:
    findings: tuple[Finding, ...]
    route: str = "build"
    pin: str | None = None

    @property
    def failed(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "fail")

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "warn")

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.failed,
            "route": self.route,
            "pin": self.pin,
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
    route: str = "build",
    costs: BuildCosts | None = None,
) -> DoctorReport:
    """Run every check that applies to this system and ``route``, in the order a user fixes them. ``costs``: what
    a build of the pin was measured to need (its MAX_JOBS comes from it)."""
    if route not in ROUTES:
        raise ValueError(f"route {route!r}: expected one of {', '.join(ROUTES)}")
    building = route == "build"
    say = step or (lambda _name: None)
    findings: list[Finding] = []
    say("platform")
    platform_findings, wsl = check_platform(probe, workdir)
    findings += platform_findings
    say("GPU (nvidia-smi)")
    findings += check_gpu(probe, wsl, serving=not building)  # serving needs a GPU, a build does not
    if building:
        say("CUDA toolkit (nvcc)")
        findings += check_cuda(probe, wsl)
    if route != "nightly":
        say("git")
        findings += _only_warn(check_git(probe), not building)
    if probe.system == "windows":
        if building:
            say("Visual Studio (vswhere)")
            findings += check_msvc(probe)
        findings += _only_warn(check_long_paths(probe), not building)
    say("Python and torch")
    torch = check_python_and_torch(probe, python or sys.executable, pin_torch)
    findings += torch if building or pin is None else [_serving_torch(f, pin) for f in torch]
    if pin is not None:  # the environment the pin's vLLM serves in (what the launch scripts check too)
        findings += check_serving(probe, python or sys.executable, pin)
    say("memory and disk")
    if building:  # RAM sets the nvcc jobs
        findings += check_memory(probe, wsl, costs)
    findings += check_disk(probe, workdir)
    if building:
        say("compiler cache")
        findings += check_compiler_cache(probe)
        say("Docker engine")
        findings += check_docker(probe)
    return DoctorReport(findings=tuple(findings), route=route, pin=pin.name if pin is not None else None)


def _serving_torch(finding: Finding, pin: Pin) -> Finding:
    """Serving a wheel, another torch than the pin's is no build choice (use_existing_torch): say what runs."""
    if finding.check != "torch-pin":
        return finding
    found = finding.summary.rsplit(" ", 1)[-1]
    return dataclasses.replace(
        finding, summary=f"vLLM {pin.version} ({pin.name}) runs with torch {pin.torch}, found {found}",
        fix=f"install torch {pin.torch}, a CUDA build (python -m pip install torch=={pin.torch} from the CUDA index "
            "your pip is set up with), or take the pin of the vLLM you serve (--pin)")


def _only_warn(findings: list[Finding], soften: bool) -> list[Finding]:
    """A build stops on these (the script checks them before its first clone); serving a wheel only may trip on
    them (git's long paths in a merge, pip's in a deep venv): a warning there."""
    if not soften:
        return findings
    return [dataclasses.replace(f, status="warn") if f.status == "fail" else f for f in findings]


__all__ = ["ROUTES", "CommandResult", "DoctorReport", "Finding", "Probe", "SystemProbe", "run_doctor"]
