"""`g4build wheel` (plan / script / build) and the build-step commands it runs: prefetch, cuda-shim,
flashinfer-wheels, manifest."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path, PurePosixPath, PureWindowsPath

import typer
from rich.table import Table

from g4build.build import docker as docker_exec
from g4build.build.arch import parse_arch
from g4build.build.executor import RunResult
from g4build.build.flashinfer import parse_spec
from g4build.build.host import HostFacts, cuda_home_of, host_os, preflight, probe
from g4build.build.plan import BuildPlan, Layout, Options, Target, base_os_of, max_jobs, wheel_version
from g4build.build.planner import default_layout, make_plan, python_cmd
from g4build.cli._common import JSON_OPTION, console, err_console, lower_option, print_json
from g4build.errors import UsageError
from g4build.index import cache_root
from g4build.pins import Pin, load_pins
from g4build.series import Series, load_all

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


def machine_choices(target: Target, host: HostFacts | None) -> tuple[int, str | None, str | None]:
    """MAX_JOBS, compiler launcher and CUDA_HOME planned from this machine's facts where they hold for the
    machine that compiles: RAM and cores when it is the target or runs the container; launcher and CUDA_HOME
    only for a native build here (inside a container they are the image's, not this machine's)."""
    compiles_here = host is not None and (host.os == target.os or target.executor == "docker")
    jobs = max_jobs(mem_gb=host.mem_gb, cores=host.cores) if host is not None and compiles_here else \
        max_jobs(mem_gb=FOREIGN_MEM_GB, cores=FOREIGN_CORES)
    native_here = host is not None and host.os == target.os and target.executor == "native"
    launcher = host.launcher if host is not None and native_here else None
    cuda_home = cuda_home_of(host.nvcc) if host is not None and native_here and host.nvcc else None
    return jobs, launcher, cuda_home


def _layout(pin: Pin, target: Target, root: str | None, out: str | None) -> Layout:
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


def _show(plan: BuildPlan) -> None:
    t = plan.target
    console.print(f"[bold]{plan.pin}[/] -> vllm {plan.version} for [bold]{t.arch.name}[/] on {t.os} "
                  f"(CUDA {t.cuda}, Python {t.python}, {t.executor})")
    env = Table(title="environment", show_header=False)
    for k, v in plan.env.items():
        env.add_row(k, v)
    console.print(env)
    console.print("[bold]steps[/]")
    for i, s in enumerate(plan.steps, 1):
        extra = "".join(f" {k}={v}" for k, v in s.env.items())
        console.print(f"{i:2d}. [bold]{s.name}[/] [dim](in {s.cwd}){extra}[/]", highlight=False)
        console.print(f"    {' '.join(s.command)}", highlight=False, markup=False, soft_wrap=True)
    for n in plan.notes:
        console.print(f"note: {n}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""

    @app.command("wheel")
    def wheel(
        arch: str = typer.Option(..., "--arch", help="GPU arch: sm120 (also sm_120, 12.0, 12.0a, 12.0f), sm121..."),
        os_name: str = typer.Option(..., "--os", help="windows, wsl or linux.", callback=lower_option),
        pin_name: str | None = typer.Option(None, "--pin", help="Pin to build (default: the default pin)."),
        release: str | None = typer.Option(
            None, "--release", help="Upstream release X.Y.Z to build; it must be pinned (see `g4build pins list`)."
        ),
        python: str = typer.Option("3.12", "--python", help="Python X.Y the wheel is for."),
        python_exe: str | None = typer.Option(
            None, "--python-exe", envvar="G4BUILD_PYTHON_EXE",
            help="Interpreter that runs the build (default: the active venv's python on Windows, pythonX.Y "
                 "elsewhere).",
        ),
        cuda: str | None = typer.Option(None, "--cuda", help="CUDA X.Y to build with (default: the pin's)."),
        executor: str = typer.Option("native", "--executor", help="native or docker."),
        out: str | None = typer.Option(None, "--out", help="Folder for the wheels (docker: default ./wheelhouse)."),
        root: str | None = typer.Option(None, "--root", help="Build root (source, logs, resume state)."),
        torch_index: str | None = typer.Option(
            None, "--torch-index", envvar="G4BUILD_TORCH_INDEX",
            help="PyTorch package index for CUDA builds ({cu} stands for cu130, cu129): the pin's torch is "
                 "installed from it before anything else (default: only checked).",
        ),
        jobs: int | None = typer.Option(None, "--jobs", min=1, help="MAX_JOBS (default: RAM/5GB, <= cores)."),
        no_flashinfer: bool = typer.Option(False, "--no-flashinfer", help="Leave FlashInfer out."),
        flashinfer_wheels: list[str] = typer.Option(
            None, "--flashinfer-wheel", metavar="PATH=SHA256",
            help="Windows: a wheel of the pin's FlashInfer version for Windows (flashinfer-python, and "
                 "jit-cache/cubin if you have them) with its sha256 (repeatable): checked, copied beside the vLLM "
                 "wheel, recorded in build-manifest.json and installed by the launch scripts.",
        ),
        sccache: bool = typer.Option(
            False, "--sccache",
            help="Windows: compile through sccache (off by default: cl.exe crashes under it with CUDA 13 at high "
                 "parallelism). Elsewhere sccache or ccache is used when found.",
        ),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; run nothing."),
        emit_script: Path | None = typer.Option(None, "--emit-script", help="Write the plan as PowerShell/bash."),
        clean: bool = typer.Option(False, "--clean", help="Run every step, even ones finished before."),
        recipes: bool = typer.Option(False, "--recipes", help="Also render launch recipes for the wheels."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Build vLLM (and FlashInfer) wheels for ARCH on OS from a pin plus its series."""
        pin = pin_for_release(release, pin_name) if release else load_pins().get(pin_name)
        target = Target(os=os_name, arch=parse_arch(arch), python=python, cuda=cuda or pin.cuda,
                        executor=executor)
        recipe_list: tuple[str, ...] = ()
        if recipes:
            from g4build.recipes import recipe_names

            recipe_list = tuple(recipe_names())
        layout = _layout(pin, target, root, out)
        running = not dry_run and emit_script is None
        # docker: the disk that matters is the host folder mounted as the build root
        probe_at = str(docker_hosts(pin.name, root=root, out=out).work) if executor == "docker" else layout.root
        host: HostFacts | None = probe(probe_at) if running or host_os() == target.os else None
        default_jobs, launcher, cuda_home = machine_choices(target, host)
        if python_exe is not None:
            python_exe = checked_python_exe(python_exe, target)
        opts = Options(jobs=jobs or default_jobs, jobs_given=jobs is not None, flashinfer=not no_flashinfer,
                       launcher=launcher, sccache=sccache,
                       python=python_cmd(target, python_exe), python_exe=python_exe, recipes=recipe_list,
                       torch_index=torch_index or None,
                       flashinfer_wheels=tuple(parse_spec(item) for item in flashinfer_wheels or ()))
        from g4build.depseries import build_series_for, uncovered

        base_os = base_os_of(pin, target.os)
        plan = make_plan(pin, series_for(pin), target, layout=layout, opts=opts, cuda_home=cuda_home,
                         build=build_series_for(pin, base_os=base_os), uncovered=uncovered(pin, base_os=base_os))
        if emit_script is not None:
            from g4build.build.script import render

            emit_script.write_text(render(plan), encoding="utf-8", newline="")
            if os.name != "nt" and target.os != "windows":
                emit_script.chmod(0o755)
            err_console.print(f"wrote {emit_script} ({'PowerShell' if target.os == 'windows' else 'bash'})")
        if dry_run or emit_script is not None:
            if as_json:
                print_json(plan.to_dict())
            elif dry_run:
                _show(plan)
            return
        assert host is not None
        preflight(plan, host, at=probe_at)
        result, wheels = _execute(plan, target, clean=clean, root=root, out=out)
        if as_json:
            print_json({**plan.to_dict(), "wheels": wheels, "result": [s.__dict__ for s in result.steps]})
        else:
            console.print(f"built in {result.seconds:.0f}s; wheels in {wheels}")

    @app.command("prefetch")
    def prefetch_cmd(
        tree: Path = typer.Option(..., "--tree", exists=True, file_okay=False, help="A vLLM source tree."),
        cache: Path | None = typer.Option(None, "--cache", help="Where the dependencies are kept."),
        write: Path | None = typer.Option(None, "--write", help="Write a CMake initial-cache file (cmake -C) here."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Clone the tree's CMake FetchContent dependencies once, so builds need no network."""
        from g4build.build.deps import find_deps, initial_cache, prefetch

        cache = cache or cache_root() / "deps"
        entries = []
        for dep in find_deps(tree):
            with err_console.status(f"prefetch {dep.name} @ {dep.tag}"):
                path = prefetch(dep, cache)
            entries.append((dep, path))
        if write:
            write.parent.mkdir(parents=True, exist_ok=True)
            write.write_text(initial_cache(entries), encoding="utf-8")
        rows = [{"name": d.name, "repository": d.repository, "tag": d.tag, "path": str(p),
                 "variables": list(d.cache_vars), "unset": list(d.unset_vars)} for d, p in entries]
        if as_json:
            print_json(rows)
        else:
            for r in rows:
                console.print(f"{r['name']} @ {r['tag']}: {r['path']}")

    @app.command("cuda-shim")
    def cuda_shim(
        dest: Path = typer.Option(..., "--dest", help="Folder for the private cuda.h."),
        cuda_home: Path | None = typer.Option(None, "--cuda-home", help="CUDA install folder (default: CUDA_HOME)."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Make cuda.h's CUtensorMap alignment acceptable to MSVC for the build (CUDA 13.0-13.2 on Windows):
        a private copy when the installed header needs it; nothing when it is already patched or newer."""
        from g4build.build.cudashim import apply

        home = cuda_home or Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "")
        if not str(home) or str(home) == ".":
            raise UsageError("no CUDA folder: expected --cuda-home or CUDA_HOME (or CUDA_PATH), found none",
                             hint="pass --cuda-home to the CUDA install folder (the one holding include\\cuda.h)")
        result = apply(home, dest)
        if as_json:
            print_json(result.to_dict())
        else:
            console.print(result.message(), markup=False, highlight=False)

    @app.command("flashinfer-wheels")
    def flashinfer_wheels_cmd(
        pin_name: str | None = typer.Option(None, "--pin"),
        out: Path = typer.Option(..., "--out", help="Folder of the build's wheels."),
        wheels: list[str] = typer.Option(..., "--wheel", metavar="PATH=SHA256",
                                         help="A FlashInfer wheel (repeatable)."),
        python: str = typer.Option("3.12", "--python", help="Python X.Y the build is for."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Check Windows FlashInfer wheels (name, version, sha256) and copy them beside the vLLM wheel."""
        from g4build.build.flashinfer import check_names, verify_and_copy

        pin = load_pins().get(pin_name)
        specs = [parse_spec(item) for item in wheels]
        check_names(specs, pin, python)
        records = verify_and_copy(specs, out)
        if as_json:
            print_json({"out": str(out), "wheels": records})
        else:
            for r in records:
                console.print(f"{r['file']}: sha256 {r['sha256']} ok, in {out}", markup=False, highlight=False)

    @app.command("manifest")
    def manifest_cmd(
        pin_name: str | None = typer.Option(None, "--pin"),
        out: Path = typer.Option(..., "--out", exists=True, file_okay=False, help="Folder with the wheels."),
        state: Path | None = typer.Option(None, "--state", help="The build's resume state (for step timings)."),
        arch: str | None = typer.Option(None, "--arch"),
        os_name: str | None = typer.Option(None, "--os", callback=lower_option),
        cuda: str | None = typer.Option(None, "--cuda"),
        flashinfer_wheels: list[str] = typer.Option(
            None, "--flashinfer-wheel", metavar="FILE=SHA256",
            help="Windows: a FlashInfer wheel the build copied into --out (repeatable)."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Write build-manifest.json beside the wheels and into the vLLM wheel's dist-info."""
        from g4build.build.flashinfer import manifest_record
        from g4build.build.manifest_info import build_extra
        from g4build.build.stamp import stamp
        from g4build.manifest import make_manifest

        pin = load_pins().get(pin_name)
        from g4build.depseries import build_series_for

        series = series_for(pin)
        build = build_series_for(pin, base_os=base_os_of(pin, os_name))
        extra = build_extra(arch=arch, os_name=os_name, cuda=cuda, state=state)
        if os_name == "windows":  # what the launch scripts and `recipe check --wheel` read
            extra["flashinfer"] = manifest_record(pin, out, [parse_spec(i) for i in flashinfer_wheels or ()])
        elif flashinfer_wheels:
            raise UsageError("--flashinfer-wheel is for Windows builds (--os windows)")
        manifest = make_manifest(pin, series, route="build", extra=extra, base_os=base_os_of(pin, os_name),
                                 build=build)
        # with --cuda the wheel's version is known: only that wheel is stamped, not older ones in --out
        touched = stamp(out, manifest, version=wheel_version(pin, series, cuda, os_name, build) if cuda else None)
        if as_json:
            print_json({"out": str(out), "wheels_stamped": touched, "manifest": manifest})
        else:
            console.print(f"wrote {out / 'build-manifest.json'}; stamped {', '.join(touched) or 'no vLLM wheel'}")


def docker_hosts(pin: str, *, root: str | None, out: str | None) -> docker_exec.HostPaths:
    """Host folders the docker executor mounts (absolute: Docker refuses relative binds): --root (else the
    cache) for source, logs and resume state; --out (else ./wheelhouse) for the wheels copied out."""
    from g4build.data import project_root

    base = cache_root()
    return docker_exec.HostPaths(work=Path(root).resolve() if root else base / "docker" / pin, deps=base / "deps",
                                 out=Path(out or "wheelhouse").resolve(), tool=project_root())


def _execute(plan: BuildPlan, target: Target, *, clean: bool, root: str | None, out: str | None,
             ) -> tuple[RunResult, str]:
    """Run ``plan``; returns what ran and the folder on this machine that holds the wheels."""
    if target.executor == "docker":
        hosts = docker_hosts(plan.pin, root=root, out=out)
        return docker_exec.DockerExecutor(hosts).run(plan, clean=clean), str(hosts.out)
    from g4build.build.native import NativeExecutor

    activate = None
    if target.os == "windows" and sys.platform == "win32":
        from g4build.build.windows import msvc_environment

        def activate() -> dict[str, str]:
            return msvc_environment(target.cuda)

    return NativeExecutor(activate=activate).run(plan, clean=clean), plan.layout.out
