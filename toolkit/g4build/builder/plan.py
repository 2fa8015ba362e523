"""BuildPlan: what ``g4build wheel`` will run, as data. Pure: no filesystem, no subprocess, no clock.

A plan is a target (os, arch, python, cuda), an environment shared by every step, and ordered steps; each
step is a command users could type themselves (``g4build source fetch``, ``pip wheel`` ...) with its cwd
and env delta. The inputs digest of a step (command, cwd, env, the plan's identity) lets a later run skip
steps that already finished (resume). Here: the plan's types and what the target alone decides (its checks,
the wheel version, the job count); the environment and the steps come from ``builder.steps``, the whole plan
from ``builder.planner``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from g4build.builder.arch import ArchInfo, check_cuda, check_os_arch, cuda_arch_list
from g4build.builder.buildcosts import GB_PER_JOB_UNMEASURED
from g4build.builder.flashinfer import FlashInferWheel
from g4build.builder.kernels import version_words
from g4build.errors import UsageError
from g4build.pins.baseroutes import no_base_routes
from g4build.pins.model import Pin
from g4build.series.deps import BuildSeries
from g4build.series.model import Series, local_label

OSES = ("windows", "wsl", "linux")
EXECUTORS = ("native", "docker")
GB_PER_NVCC_JOB = GB_PER_JOB_UNMEASURED  # a build with no measured peak per job (builder/buildcosts.py)


@dataclass(frozen=True, kw_only=True)
class Target:
    os: str
    arch: ArchInfo
    python: str
    cuda: str
    executor: str = "native"

    def to_dict(self) -> dict[str, Any]:
        return {
            "os": self.os,
            "arch": self.arch.name,
            "python": self.python,
            "cuda": self.cuda,
            "executor": self.executor,
            "torch_cuda_arch_list": cuda_arch_list(self.arch, self.cuda),
        }


@dataclass(frozen=True, kw_only=True)
class Step:
    name: str
    command: tuple[str, ...]
    cwd: str
    env: dict[str, str] = field(default_factory=dict)
    title: str = ""
    resumable: bool = True  # False: always run (cheap checks, outputs that depend on later state)
    fresh: str = ""  # a folder removed before the step runs (never when skipped): the step makes it from nothing

    def digest(self, plan_env: dict[str, str], identity: str) -> str:
        payload = json.dumps(
            [identity, self.name, list(self.command), self.cwd, sorted(self.env.items()), sorted(plan_env.items())]
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "command": list(self.command), "cwd": self.cwd, "env": dict(self.env)}


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Where a build lives. ``root`` holds the source tree, logs and state; ``out`` the wheels."""

    root: str
    out: str
    cache: str  # prefetched CMake dependencies, shared between builds
    sep: str = "/"

    def join(self, *parts: str) -> str:
        return self.sep.join([self.root.rstrip("/\\"), *parts])

    @property
    def src(self) -> str:
        return self.join("src")

    @property
    def deps_file(self) -> str:
        return self.join("prefetched-deps.cmake")

    @property
    def state_file(self) -> str:
        return self.join("g4build-state.json")

    @property
    def log_dir(self) -> str:
        return self.join("logs")

    @property
    def build_order(self) -> str:
        """The ninja wrapper's folder (``g4build build-order``): long units first."""
        return self.join("build-order")

    @property
    def compiler_cache(self) -> str:
        """The compiler cache's folder: beside the prefetched dependencies, shared by every build (its entries
        are keyed by content, so builds of other pins or series versions only add to it)."""
        return self.sep.join([self.cache.rstrip("/\\"), "compiler-cache"])


@dataclass(frozen=True, kw_only=True)
class Options:
    jobs: int  # MAX_JOBS (already chosen from RAM/cores or --jobs)
    jobs_given: bool = False  # --jobs: the script keeps it; else a Windows script counts its own machine's RAM
    nvcc_threads: int = 1
    gb_per_job: float = GB_PER_NVCC_JOB  # memory one nvcc job needs: measured for the pin and arch, else 5 GB
    flashinfer: bool = True
    unit_order: bool = False  # the pin's longest units are recorded for the arch: ninja starts them first
    flashinfer_full: bool = False  # --flashinfer-full: upstream's whole jit-cache (every module), not the recipes'
    existing_torch: bool = True
    launcher: str | None = None  # the compiler cache, "sccache" or "ccache" (Linux: when found; Windows: --sccache)
    sccache: bool = False  # --sccache: on Windows a compiler launcher is used only when asked for
    # where sccache keeps units when its environment names a shared backend (a bucket, the GitHub Actions
    # cache: builder.cachebackend); None: the compiler cache folder of the layout
    cache_backend: str | None = None
    g4build: tuple[str, ...] = ("g4build",)
    python: tuple[str, ...] = ("python",)
    torch_index: str | None = None  # --torch-index: install the pin's torch from it first ({cu}: cu130 ...)
    python_exe: str | None = None  # --python-exe: an interpreter named by path (no active venv needed)
    recipes: tuple[str, ...] = ()  # launch recipes to render beside the wheels (--recipes)
    flashinfer_wheels: tuple[FlashInferWheel, ...] = ()  # Windows: FlashInfer wheels given (--flashinfer-wheel)
    # --kernels: vLLM's kernel profile (KERNEL_PROFILES), a CMake variable of the build series; "auto" until
    # make_plan resolves it (builder.kernels.resolve_kernels)
    kernels: str = "all"
    flash_attn: str = "all"  # --flash-attn: "2" builds FlashAttention 2 alone (no FA3 even for 9.0a)


@dataclass(frozen=True, kw_only=True)
class BuildPlan:
    target: Target
    pin: str
    version: str  # the wheel version: <upstream>+cu<XY>.g4.<digest>
    layout: Layout
    env: dict[str, str]
    setup: tuple[str, ...]  # shell lines a script runs first (e.g. MSVC activation on Windows)
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()
    jobs_from_machine: bool = False  # a script computes MAX_JOBS on the machine it runs on (unless set there)
    gb_per_job: float = GB_PER_NVCC_JOB  # the figure that script divides its RAM by
    build_series: tuple[dict[str, Any], ...] = ()  # BuildSeries.record of each build series the steps apply
    prerequisites: tuple[str, ...] = ()  # what to install on the build machine first (builder.prereqs)
    estimate: str = ""  # time and disk, from the measured compile work (builder.prereqs)

    @property
    def identity(self) -> str:
        return f"{self.pin}|{self.version}|{self.target.os}|{self.target.arch.name}|{self.target.cuda}"

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": {**self.target.to_dict(), "pin": self.pin, "version": self.version,
                       "root": self.layout.root, "out": self.layout.out},
            "env": dict(self.env),
            "steps": [s.to_dict() for s in self.steps],
            "setup": list(self.setup),
            "notes": list(self.notes),
            "build_series": list(self.build_series),
            "prerequisites": list(self.prerequisites),
            "estimate": self.estimate,
        }


def max_jobs(*, mem_gb: float, cores: int, nvcc_threads: int = 1, gb_per_job: float = GB_PER_NVCC_JOB) -> int:
    """Parallel nvcc jobs that fit: ``gb_per_job`` each (times its threads), never more than the cores."""
    by_mem = int(mem_gb // (gb_per_job * max(1, nvcc_threads)))
    return max(1, min(cores, by_mem))


def base_os_of(pin: Pin, os_name: str | None) -> str | None:
    """The OS whose base tree a build for ``os_name`` starts from: only Windows builds use one."""
    return "windows" if os_name == "windows" and "windows" in pin.bases else None


def wheel_version(pin: Pin, series: Sequence[Series], cuda: str, os_name: str | None = None,
                  build: Sequence[BuildSeries] = (), *, kernels: str = "all", flash_attn: str = "all") -> str:
    """``<upstream>+cu<XY>.g4.<digest>``; a build from the pin's base tree for ``os_name`` gets its own digest,
    and the build series the compiled code carries count too. A build of fewer kernels (``kernels``,
    ``flash_attn``) names them in the label: same series, other compiled code, so another version."""
    label = local_label(cuda, pin, series, base_os_of(pin, os_name), [b.series for b in build],
                        version_words(kernels, flash_attn))
    return f"{pin.version}+{label}"


def check_target(target: Target, pin: Pin, *, flashinfer: bool = True) -> None:
    """Everything knowable from pin + target alone; raises before anything runs. ``flashinfer``: the plan
    builds FlashInfer's ahead-of-time kernels (so the CUDA must be new enough for them too)."""
    if target.os not in OSES:
        raise UsageError(f"unknown OS {target.os!r}: expected one of {', '.join(OSES)}")
    if target.executor not in EXECUTORS:
        raise UsageError(f"unknown executor {target.executor!r}: expected one of {', '.join(EXECUTORS)}")
    check_os_arch(target.os, target.arch)
    if target.executor == "docker" and target.os == "windows":
        raise UsageError(
            "the docker executor builds Linux wheels; a Windows wheel needs --executor native on Windows",
            hint="use --os wsl --executor docker for a wheel that runs inside WSL",
        )
    if target.os == "windows" and "windows" not in pin.bases:
        raise UsageError(
            f"pin {pin.name} names no Windows base: upstream's setup.py builds nothing on win32, so a native Windows "
            f"build starts from a Windows fork's tree, and patches/pins.yaml records none for vLLM {pin.version} "
            "(a fork commit is pinned only once it is verified)",
            hint=no_base_routes(pin, "windows", target.arch.name),
        )
    # FlashInfer's ahead-of-time build is Linux-only; on Windows (or with --no-flashinfer) it is not in the plan.
    check_cuda(target.arch, target.cuda, flashinfer=flashinfer and target.os != "windows")
    parts = target.python.split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or (int(parts[0]), int(parts[1])) < (3, 10):
        raise UsageError(f"--python {target.python!r}: expected X.Y, at least 3.10")
