"""``g4build wheel`` as stage calls: what the user asked for (``WheelRequest``) resolved into a BuildPlan for the
machine that compiles (``plan_wheel``: the pin, absolute paths there, this machine's MAX_JOBS, compiler cache and
CUDA where they hold), and that plan run here by the executor it names (``build_wheel``).

The planner itself stays pure; this module is where the request meets this machine (host facts, its paths, the
project's pins and series).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

from g4build.builder.arch import parse_arch
from g4build.builder.buildcosts import BuildCosts, choose_jobs, load_costs
from g4build.builder.cachebackend import sccache_backend
from g4build.builder.executors import docker as docker_exec
from g4build.builder.executors.base import Executor, RunResult
from g4build.builder.executors.native import NativeExecutor
from g4build.builder.flashinfer import parse_spec
from g4build.builder.host import HostFacts, cuda_home_of, host_os, preflight, probe
from g4build.builder.plan import GB_PER_NVCC_JOB, BuildPlan, Layout, Options, Target, base_os_of
from g4build.builder.planner import default_layout, make_plan, python_cmd
from g4build.builder.platforms.windows import msvc_environment
from g4build.data import patches_dir, project_root
from g4build.errors import UsageError
from g4build.pins.index import cache_root
from g4build.pins.model import Pin, load_pins
from g4build.series.deps import build_series_for, uncovered
from g4build.series.model import Series, load_all

# MAX_JOBS planned for another machine: a 32 GB / 16-core desktop; the script honours a MAX_JOBS already set.
FOREIGN_MEM_GB, FOREIGN_CORES = 32.0, 16


def series_for(pin: Pin) -> list[Series]:
    """The series (in order) that have something to say about ``pin``."""
    return [s for s in load_all() if s.variant(pin.name) is not None]


def pin_for_release(release: str, pin_name: str | None) -> Pin:
    """The pin of upstream release ``release``. Building needs a pin (a pinned sdist sha256 and reviewed patch
    variants), so an unpinned release is refused with what to do; ``patches check --release`` shows drift."""
    pins = load_pins()
    if pin_name:
        raise UsageError(f"give --pin or --release, not both (found {pin_name} and {release})")
    for pin in pins.pins.values():
        if pin.version == release:
            return pin
    nearest = pins.nearest(release)
    raise UsageError(
        f"vLLM {release} is not pinned: expected one of {', '.join(p.version for p in pins.pins.values())}",
        hint=f"run `g4build patches check --release {release}` (it uses {nearest.name}'s patches), then add a "
        f"pin for {release} to patches/pins.yaml with the sdist sha256 the index publishes",
    )


def absolute_on_target(path: str, option: str, target: Target) -> str:
    """``path`` as an absolute path of the machine the plan runs on: steps run in different folders, so a
    relative --out or --root would scatter the wheels. Resolved here when this machine's paths are the
    target's kind (posix / Windows); refused when the plan is for the other kind."""
    windows_target = target.os == "windows"
    flavour = PureWindowsPath if windows_target else PurePosixPath
    if flavour(path).is_absolute():
        return path
    if windows_target == (host_os() == "windows"):
        return str(Path(path).resolve())
    example = "C:\\g4b" if windows_target else "/home/me/g4b"
    raise UsageError(f"{option} {path!r} is relative: expected an absolute path on the {target.os} machine",
                     hint=f"give the full path there, for example {option} {example}")


def checked_python_exe(exe: str, target: Target) -> str:
    """--python-exe as given, refused when this machine is the target and has no such interpreter."""
    if not exe.strip():
        raise UsageError("--python-exe is empty: expected the path of a Python interpreter",
                         hint="for example --python-exe C:\\g4b\\venv\\Scripts\\python.exe")
    if target.executor == "native" and host_os() == target.os and not (Path(exe).is_file() or shutil.which(exe)):
        raise UsageError(f"--python-exe {exe!r}: expected an existing Python interpreter, found no such file",
                         hint="give the full path of the venv's python (Scripts\\python.exe on Windows, "
                              "bin/python elsewhere)")
    return exe


def shared_cache() -> str | None:
    """sccache's shared backend as this machine's environment names it (None: the local folder)."""
    backend = sccache_backend(os.environ.get)
    return backend.where if backend.shared else None


def machine_choices(target: Target, host: HostFacts | None,
                    costs: BuildCosts | None = None) -> tuple[int, str | None, str | None]:
    """MAX_JOBS, compiler launcher and CUDA_HOME planned from this machine's facts where they hold for the
    machine that compiles: RAM and cores when it is the target or runs the container, over the measured memory
    per job of ``costs`` (the pin's for the arch); launcher and CUDA_HOME only for a native build here (inside
    a container they are the image's, not this machine's)."""
    compiles_here = host is not None and (host.os == target.os or target.executor == "docker")
    mem, cores = (host.mem_gb, host.cores) if host is not None and compiles_here else (FOREIGN_MEM_GB, FOREIGN_CORES)
    jobs = choose_jobs(mem_gb=mem, cores=cores, costs=costs).jobs
    native_here = host is not None and host.os == target.os and target.executor == "native"
    launcher = host.launcher if host is not None and native_here else None
    cuda_home = cuda_home_of(host.nvcc) if host is not None and native_here and host.nvcc else None
    return jobs, launcher, cuda_home


def docker_hosts(pin: str, *, root: str | None, out: str | None) -> docker_exec.HostPaths:
    """Host folders the docker executor mounts (absolute: Docker refuses relative binds): --root (else the
    cache) for source, logs and resume state; --out (else ./wheelhouse) for the wheels copied out."""
    base = cache_root()
    return docker_exec.HostPaths(work=Path(root).resolve() if root else base / "docker" / pin, deps=base / "deps",
                                 out=Path(out or "wheelhouse").resolve(), tool=project_root())


def build_layout(pin: Pin, target: Target, root: str | None, out: str | None) -> Layout:
    """Where the build lives on the machine that compiles: the container's fixed layout, or the OS's default
    with --root / --out (absolute there) in place."""
    if target.executor == "docker":
        return docker_exec.container_layout()
    root = absolute_on_target(root, "--root", target) if root else None
    out = absolute_on_target(out, "--out", target) if out else None
    if target.os != "windows" and host_os() == "windows" and not root:
        raise UsageError(f"a {target.os} build planned on Windows needs --root: a folder on the {target.os} machine",
                         hint="for example --root ~/g4b expanded on that machine (e.g. /home/me/g4b)")
    lay = default_layout(pin, target, base=cache_root().as_posix())
    if root:
        lay = Layout(root=root, out=f"{root}{lay.sep}wheels", cache=lay.cache, sep=lay.sep)
    if out:
        lay = Layout(root=lay.root, out=out, cache=lay.cache, sep=lay.sep)
    return lay


@dataclass(frozen=True, kw_only=True)
class WheelRequest:
    """The options of ``g4build wheel``, as typed (paths not yet resolved)."""

    arch: str
    os_name: str
    pin_name: str | None = None
    release: str | None = None
    python: str = "3.12"
    python_exe: str | None = None
    cuda: str | None = None
    executor: str = "native"
    out: str | None = None
    root: str | None = None
    torch_index: str | None = None
    jobs: int | None = None
    flashinfer: bool = True
    flashinfer_full: bool = False  # upstream's whole jit-cache instead of the recipes' modules
    flashinfer_wheels: tuple[str, ...] = ()  # PATH=SHA256 items
    sccache: bool = False
    recipes: tuple[str, ...] = ()  # launch recipes to render beside the wheels
    kernels: str = "auto"  # --kernels: the kernel profile (auto: the arch's default, builder.kernels.AUTO_PROFILE)
    flash_attn: str = "all"  # --flash-attn
    run_here: bool = False  # the plan runs on this machine now (not only printed or written as a script)


@dataclass(frozen=True, kw_only=True)
class WheelPlan:
    request: WheelRequest
    plan: BuildPlan
    host: HostFacts | None  # this machine, probed when it runs the plan or is the target's OS
    probe_at: str  # the folder whose disk the preflight checks (docker: the host folder mounted as the root)


def plan_wheel(request: WheelRequest) -> WheelPlan:
    """The build plan of ``request``; raises UsageError/BuildError for what is wrong before any step."""
    r = request
    pin = pin_for_release(r.release, r.pin_name) if r.release else load_pins().get(r.pin_name)
    target = Target(os=r.os_name, arch=parse_arch(r.arch), python=r.python, cuda=r.cuda or pin.cuda,
                    executor=r.executor)
    layout = build_layout(pin, target, r.root, r.out)
    probe_at = str(docker_hosts(pin.name, root=r.root, out=r.out).work) if r.executor == "docker" else layout.root
    host = probe(probe_at) if r.run_here or host_os() == target.os else None
    costs = load_costs(patches_dir(), pin.name, target.arch.name)
    default_jobs, launcher, cuda_home = machine_choices(target, host, costs)
    python_exe = checked_python_exe(r.python_exe, target) if r.python_exe is not None else None
    opts = Options(jobs=r.jobs or default_jobs, jobs_given=r.jobs is not None, flashinfer=r.flashinfer,
                   gb_per_job=costs.gb_per_job if costs is not None else GB_PER_NVCC_JOB,
                   unit_order=costs is not None and bool(costs.units),
                   flashinfer_full=r.flashinfer_full, launcher=launcher, sccache=r.sccache,
                   cache_backend=shared_cache(),
                   python=python_cmd(target, python_exe), python_exe=python_exe, recipes=r.recipes,
                   torch_index=r.torch_index or None, kernels=r.kernels, flash_attn=r.flash_attn,
                   flashinfer_wheels=tuple(parse_spec(item) for item in r.flashinfer_wheels))
    base_os = base_os_of(pin, target.os)
    plan = make_plan(pin, series_for(pin), target, layout=layout, opts=opts, cuda_home=cuda_home,
                     build=build_series_for(pin, base_os=base_os), uncovered=uncovered(pin, base_os=base_os))
    return WheelPlan(request=request, plan=plan, host=host, probe_at=probe_at)


def executor_for(plan: BuildPlan, *, root: str | None, out: str | None) -> tuple[Executor, str]:
    """The executor that runs ``plan`` on this machine, and the folder here that will hold the wheels."""
    target = plan.target
    if target.executor == "docker":
        hosts = docker_hosts(plan.pin, root=root, out=out)
        return docker_exec.DockerExecutor(hosts), str(hosts.out)
    activate = None
    if target.os == "windows" and sys.platform == "win32":

        def activate() -> dict[str, str]:
            return msvc_environment(target.cuda)

    return NativeExecutor(activate=activate), plan.layout.out


def build_wheel(planned: WheelPlan, *, clean: bool) -> tuple[RunResult, str]:
    """Check this machine against the plan (disk, compilers), then run it; returns what ran and the folder on
    this machine that holds the wheels."""
    assert planned.host is not None, "plan_wheel probes this machine when the request has run_here"
    preflight(planned.plan, planned.host, at=planned.probe_at)
    executor, wheels = executor_for(planned.plan, root=planned.request.root, out=planned.request.out)
    return executor.run(planned.plan, clean=clean), wheels
