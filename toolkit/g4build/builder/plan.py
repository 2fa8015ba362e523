"""BuildPlan: what ``g4build wheel`` will run, as data. Pure: no filesystem, no subprocess, no clock.

A plan is a target (os, arch, python, cuda), an environment shared by every step, and ordered steps; each
step is a command users could type themselves (``g4build source fetch``, ``pip wheel`` ...) with its cwd
and env delta. The inputs digest of a step (command, cwd, env, the plan's identity) lets a later run skip
steps that already finished (resume).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from g4build.builder.arch import ArchInfo, check_cuda, check_os_arch, cuda_arch_list, flashinfer_arch_list
from g4build.builder.buildcosts import GB_PER_JOB_UNMEASURED
from g4build.builder.flashinfer import FlashInferWheel
from g4build.builder.flashinfer_aot import PACKAGE
from g4build.builder.kernels import build_option_args
from g4build.errors import ConfigError, UsageError
from g4build.pins.baseroutes import no_base_routes
from g4build.pins.model import Pin, cuda_problem, version_problem
from g4build.series.deps import BuildSeries
from g4build.series.model import Series, local_label

OSES = ("windows", "wsl", "linux")
EXECUTORS = ("native", "docker")
GB_PER_NVCC_JOB = GB_PER_JOB_UNMEASURED  # a build with no measured peak per job (builder/buildcosts.py)
FLASHINFER_REMOTE = "https://github.com/flashinfer-ai/flashinfer.git"
# `python -m build --no-isolation` builds against what is installed: install `build` and the project's own
# [build-system] requires (read from its pyproject.toml, so a new FlashInfer release needs no change here).
BUILD_REQUIRES = (
    "import subprocess, sys; "
    "pip = lambda *a: subprocess.check_call([sys.executable, '-m', 'pip', 'install', *a]); "
    "pip('build'); "
    "toml = __import__('tomllib' if sys.version_info >= (3, 11) else 'tomli'); "
    "pip(*toml.load(open('pyproject.toml', 'rb'))['build-system']['requires'])"
)


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
    kernels: str = "all"  # --kernels: vLLM's kernel profile (KERNEL_PROFILES), a CMake variable of the build series
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
                  build: Sequence[BuildSeries] = ()) -> str:
    """``<upstream>+cu<XY>.g4.<digest>``; a build from the pin's base tree for ``os_name`` gets its own digest,
    and the build series the compiled code carries count too."""
    return f"{pin.version}+{local_label(cuda, pin, series, base_os_of(pin, os_name), [b.series for b in build])}"


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


def build_env(target: Target, pin: Pin | None, version: str, layout: Layout, opts: Options) -> dict[str, str]:
    """The environment every step of a vLLM build sees (the OS module adds its own on top)."""
    env = {
        "TORCH_CUDA_ARCH_LIST": cuda_arch_list(target.arch, target.cuda),
        "MAX_JOBS": str(opts.jobs),
        "NVCC_THREADS": str(opts.nvcc_threads),
        "CMAKE_BUILD_TYPE": "Release",
        "VLLM_TARGET_DEVICE": "cuda",
        "SETUPTOOLS_SCM_PRETEND_VERSION": version,
        "VLLM_VERSION_OVERRIDE": version,
        # prefetched FetchContent sources (FETCHCONTENT_SOURCE_DIR_*, VLLM_*_SRC_DIR) as a CMake initial cache
        "CMAKE_ARGS": f"-C {layout.deps_file}",
        "FETCHCONTENT_BASE_DIR": layout.join("fetchcontent"),
        # vLLM's developer switch, blanked should the user's environment export it: set, vllm_flash_attn.cmake
        # installs FlashAttention 4's cute folder as a symlink to the source, its imports not rewritten (see
        # builder/deps.py); empty, it unsets the variable and the initial cache's FetchContent source is used
        "VLLM_FLASH_ATTN_SRC_DIR": "",
    }
    if opts.flashinfer and target.os != "windows":
        env["FLASHINFER_CUDA_ARCH_LIST"] = flashinfer_arch_list(target.arch, target.cuda)
    if opts.launcher is None:
        env["VLLM_DISABLE_SCCACHE"] = "1"
    else:
        if opts.launcher == "ccache":
            env["VLLM_DISABLE_SCCACHE"] = "1"  # vLLM prefers sccache when both exist; pick the one we found
        env.update(compiler_cache_env(opts.launcher, layout))
    if extra := build_option_args(opts.kernels, opts.flash_attn):
        env["CMAKE_ARGS"] = f"{env['CMAKE_ARGS']} {extra}"
    if orders_units(target, opts):  # setup.py configures and builds in one go: CMake itself names the wrapper
        env["CMAKE_ARGS"] += f" -DCMAKE_MAKE_PROGRAM={layout.build_order}{layout.sep}ninja"
    return env


def orders_units(target: Target, opts: Options) -> bool:
    """The build runs ninja through g4build's wrapper (a POSIX shell script: not on Windows)."""
    return opts.unit_order and target.os != "windows"


def compiler_cache_where(opts: Options, layout: Layout) -> str:
    """Where the compiler cache keeps units: sccache's shared backend when one is configured, else the folder."""
    if opts.launcher == "sccache" and opts.cache_backend:
        return f"{opts.cache_backend}, shared with every machine that uses it"
    return layout.compiler_cache


def compiler_cache_env(launcher: str, layout: Layout) -> dict[str, str]:
    """The compiler cache for every C, C++ and CUDA unit, named to CMake itself (vLLM's setup.py appends
    CMAKE_ARGS after its own choice, so this one wins), and its folder. The build's paths do not change with
    the series version (the source folder, the patched dependency copies), so after a Python-only series bump
    every unit is a cache hit: no nvcc runs."""
    launchers = " ".join(f"-DCMAKE_{lang}_COMPILER_LAUNCHER={launcher}" for lang in ("C", "CXX", "CUDA"))
    return {"CMAKE_ARGS": f"-C {layout.deps_file} {launchers}",
            "SCCACHE_DIR" if launcher == "sccache" else "CCACHE_DIR": layout.compiler_cache}


def build_series_steps(pin: Pin, build: Sequence[BuildSeries], layout: Layout, g4b: tuple[str, ...]) -> list[Step]:
    """One step per build series, after the prefetch: vLLM's own to the tree, a dependency's to a patched copy
    that the CMake initial cache then names. Always run (cheap once the copy exists): a prefetch that ran again
    rewrote the initial cache with the pristine copies."""
    steps = []
    for b in build:
        v = b.variant(pin.name)
        n = len(b.series.patches_for(pin.name))
        at = f" @ {v.commit[:12]}" if v is not None and v.commit else ""
        steps.append(Step(
            name=f"deps-{b.name}", title=f"patch {b.project}{at}: {b.name} v{b.version} ({n} patch{'es' * (n != 1)})",
            command=(*g4b, "deps", "apply", "--pin", pin.name, "--tree", layout.src, "--series", b.name,
                     "--cache", layout.cache, "--write", layout.deps_file),
            cwd=layout.root, resumable=False))
    return steps


def vllm_steps(
    *, pin: Pin, target: Target, layout: Layout, opts: Options, source: tuple[Step, ...], extra: tuple[Step, ...],
    version: str, pre: tuple[Step, ...] = (), build: Sequence[BuildSeries] = (),
) -> tuple[Step, ...]:
    g4b, py, src, out = opts.g4build, opts.python, layout.src, layout.out
    arch = target.arch.name
    # this build's wheel only: an --out folder may still hold wheels of earlier builds (other series versions)
    wheel = layout.sep.join([out, f"vllm-{version}-*.whl"])
    steps: list[Step] = [
        *pre,
        *source,
        Step(name="patches", title="apply the series", command=(*g4b, "patches", "apply", "--pin", pin.name,
             "--tree", src), cwd=layout.root),
        Step(name="prefetch", title="prefetch CMake dependencies",
             command=(*g4b, "prefetch", "--tree", src, "--cache", layout.cache, "--write", layout.deps_file),
             cwd=layout.root),
        *build_series_steps(pin, build, layout, g4b),
    ]
    # torch before anything that depends on it: the fork's requirements/windows.txt (xformers wants torch >= 2.10)
    # would otherwise pull PyPI's torch, which on Windows is the CPU build
    if opts.torch_index:
        steps.append(Step(name="torch-install", title=f"install torch {pin.torch} for CUDA {target.cuda}",
                          command=(*py, "-m", "pip", "install", f"torch=={pin.torch}", "--index-url",
                                   torch_index_url(opts.torch_index, target.cuda)), cwd=layout.root))
    # the program runs through `g4build build-check`, so the step reads as what it checks (cli/buildcheck.py)
    check = (*g4b, "build-check", "torch", *exe_words(py), "--torch", pin.torch, "--cuda", target.cuda)
    steps.append(Step(name="torch", title=f"check torch {pin.torch} for CUDA {target.cuda}", resumable=False,
                      command=check, cwd=layout.root))
    if opts.existing_torch:  # strips torch from requirements/*.txt, so no requirements below replace it
        steps.append(Step(name="use-existing-torch", title="build against the installed torch",
                          command=(*py, "use_existing_torch.py"), cwd=src))
    steps += extra
    steps.append(Step(name="build-requirements", title="install build requirements",
                      command=(*py, "-m", "pip", "install", "-r", "requirements/build/cuda.txt"), cwd=src))
    steps.append(Step(name="torch-kept", title="check the requirements kept that torch", resumable=False,
                      command=check, cwd=layout.root))
    if orders_units(target, opts):
        steps.append(Step(name="build-order", title="long compile units first", resumable=False,
                          command=(*g4b, "build-order", "--pin", pin.name, "--arch", arch,
                                   "--write", layout.build_order), cwd=layout.root))
    steps.append(wheel_step("vllm", "build the vLLM wheel", opts, src, out))
    if opts.flashinfer and target.os != "windows" and not opts.flashinfer_full:
        steps += flashinfer_aot_steps(pin, target, layout, opts)
    elif opts.flashinfer and target.os != "windows":
        fi = layout.join("flashinfer")
        steps += [
            Step(name="flashinfer-source", title="fetch FlashInfer",
                 command=("git", "clone", "--depth", "1", "--branch", f"v{pin.flashinfer}", "--recurse-submodules",
                          "--shallow-submodules", FLASHINFER_REMOTE, fi), cwd=layout.root, fresh=fi),
            Step(name="flashinfer-build-requirements", title="install FlashInfer's build requirements",
                 command=(*py, "-c", BUILD_REQUIRES), cwd=fi),
            Step(name="flashinfer-python", title="build flashinfer-python",
                 command=(*py, "-m", "build", "--no-isolation", "--wheel", "--outdir", out, "."), cwd=fi),
            Step(name="flashinfer-jit-cache", title=f"build FlashInfer's ahead-of-time kernels for {arch}",
                 command=(*py, "-m", "build", "--no-isolation", "--wheel", "--outdir", out, "."),
                 cwd=layout.sep.join([fi, "flashinfer-jit-cache"])),
        ]
    steps += [
        # the manifest goes into the wheel (and the wheel gets the tags its libraries justify) before validate
        # reads it: validate then sees the series the wheel carries and checks their fingerprints
        Step(name="manifest", title="write build-manifest.json into the wheel, tag it", resumable=False,
             command=(*g4b, "manifest", "--pin", pin.name, "--out", out, "--state", layout.state_file,
                      "--arch", arch, "--os", target.os, "--cuda", target.cuda,
                      "--kernels", opts.kernels, "--flash-attn", opts.flash_attn,
                      *(a for w in opts.flashinfer_wheels for a in ("--flashinfer-wheel", f"{w.filename}={w.sha256}"))),
             cwd=layout.root),
        Step(name="validate", title="validate the wheels", resumable=False,
             command=(*g4b, "validate", wheel, "--arch", arch, "--pin", pin.name),
             cwd=layout.root),
    ]
    shell = "powershell" if target.os == "windows" else "bash"
    steps += [Step(name=f"recipe-{name}", title=f"launch script {name}", resumable=False,
                   command=(*g4b, "recipe", "render", name, "--shell", shell, "--out", out,
                            "--wheel", wheel), cwd=layout.root)
              for name in opts.recipes]
    return tuple(steps)


def exe_words(python: tuple[str, ...]) -> tuple[str, ...]:
    """``--python-exe WORD`` for each word of the interpreter's command (`g4build build-check`)."""
    return tuple(x for word in python for x in ("--python-exe", word))


def python_check(version: str, *, need_venv: bool) -> str:
    """A one-line Python program (single quotes only, for PowerShell) that exits non-zero unless it runs on
    Python ``version`` and, with ``need_venv``, inside a virtual environment, saying what it found."""
    want = "a virtual environment with Python" if need_venv else "Python"
    venv_ok = "sys.prefix != sys.base_prefix" if need_venv else "True"
    return (
        "import sys; "
        "v = '%d.%d' % sys.version_info[:2]; "
        f"venv = {venv_ok}; "
        f"sys.exit(0 if v == '{version}' and venv else "
        f"'expected {want} {version}, found ' + sys.executable + ' (Python ' + v + "
        "('' if venv else ', not a virtual environment') + "
        f"'): create a venv with Python {version}, activate it and rerun, or pass --python-exe PATH')"
    )


def torch_index_url(index: str, cuda: str) -> str:
    """A PyTorch package index URL for ``cuda``: ``{cu}`` in it stands for ``cu130``, ``cu129`` ..."""
    return index.replace("{cu}", "cu" + cuda.replace(".", ""))


def torch_check(torch: str, cuda: str) -> str:
    """A one-line Python program (single quotes only, for PowerShell) that exits non-zero unless the
    interpreter has torch ``torch`` built for CUDA ``cuda`` (its CUDA line: 13.0 for 13.0.x), saying what it
    found and what to install. The values are pins (typed by the pins loader); a value that is no version is
    refused here as well, since it would become code in the program."""
    why = version_problem(torch) or cuda_problem(cuda)
    if why:
        raise ConfigError(f"torch {torch!r} / CUDA {cuda!r}: expected versions (e.g. 2.11.0 and 13.0); {why}",
                          hint="check torch and cuda of the pin in patches/pins.yaml")
    cu = "cu" + cuda.replace(".", "")
    return (
        "import importlib.util, sys; "
        "t = __import__('torch') if importlib.util.find_spec('torch') else None; "
        "v = t.__version__ if t else 'no torch'; "
        "c = t.version.cuda if t else None; "  # None in a CPU build
        "line = '.'.join(str(c).split('.')[:2]) if c else None; "
        f"sys.exit(0 if t and v.split('+')[0] == '{torch}' and line == '{cuda}' else "
        f"'expected torch {torch} built for CUDA {cuda} in ' + sys.executable + ', found ' + "
        f"(v if t is None else v + (' built for CUDA ' + str(c) if c else ' without CUDA (a CPU build)')) + "
        f"': install torch=={torch} from the PyTorch {cu} wheel index into that Python first "
        f"(g4build wheel --torch-index URL does it), then rerun')"
    )


def wheel_step(name: str, title: str, opts: Options, project: str, out: str) -> Step:
    """``pip wheel`` of a project against the installed build requirements (torch included)."""
    return Step(name=name, title=title, cwd=project,
                command=(*opts.python, "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps", "-v",
                         "-w", out))


def extension_plan(
    *, target: Target, layout: Layout, opts: Options, project: str, name: str, version: str,
    cuda_home: str | None = None,
) -> BuildPlan:
    """A plan for any CUDA extension project with the environment a vLLM build gets (arch list, jobs,
    version, build type): the same machinery, small enough for CI to run for real."""
    env = {k: v for k, v in build_env(target, None, version, layout, opts).items()
           if k not in ("CMAKE_ARGS", "FETCHCONTENT_BASE_DIR", "VLLM_FLASH_ATTN_SRC_DIR")}
    if opts.launcher:  # the compiler cache without vLLM's dependency cache file
        env["CMAKE_ARGS"] = compiler_cache_env(opts.launcher, layout)["CMAKE_ARGS"].split(" ", 2)[2]
    if cuda_home:
        env["CUDA_HOME"] = cuda_home
    step = wheel_step(name, f"build the {name} wheel", opts, project, layout.out)
    return BuildPlan(target=target, pin=name, version=version, layout=layout, env=env, setup=(), steps=(step,))


def flashinfer_aot_steps(pin: Pin, target: Target, layout: Layout, opts: Options) -> list[Step]:
    """The default FlashInfer route: only the JIT modules the launch recipes load (derived from them for the pin),
    compiled from the pin's flashinfer-python sdist into a jit-cache wheel beside vLLM's, then validated: every
    module with SASS for the arch. vLLM's own requirement brings flashinfer-python from the index."""
    arch_list = flashinfer_arch_list(target.arch, target.cuda)
    work = layout.join("flashinfer-aot")
    wheel = layout.sep.join([layout.out, f"{PACKAGE}-{pin.flashinfer}+g4jit.*.whl"])
    exe = ("--python-exe", opts.python[0]) if len(opts.python) == 1 else ()
    return [
        Step(name="flashinfer-aot", title=f"compile the recipes' FlashInfer modules for {arch_list}",
             command=(*opts.g4build, "flashinfer-aot", "--pin", pin.name, "--arch", arch_list, "--out", layout.out,
                      "--work", work, "--jobs", str(opts.jobs), *exe), cwd=layout.root),
        Step(name="flashinfer-validate", title="validate the FlashInfer jit-cache wheel", resumable=False,
             command=(*opts.g4build, "validate", wheel, "--arch", target.arch.name), cwd=layout.root),
    ]
