"""`g4build wheel` (plan / script / build) and the build-step commands it runs: prefetch, cuda-shim,
flashinfer-wheels, manifest."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from g4build.builder.cudashim import apply as apply_cuda_shim
from g4build.builder.cudashim import resolve_cuda_home
from g4build.builder.deps import prefetch_all
from g4build.builder.flashinfer import check_names, parse_spec, verify_and_copy
from g4build.builder.plan import BuildPlan
from g4build.builder.request import WheelRequest, build_wheel, plan_wheel
from g4build.builder.script import write_script
from g4build.cli._common import JSON_OPTION, console, err_console, lower_option, print_json
from g4build.cli.outpaths import output_file, output_folder, writing
from g4build.emit.write import write_build_manifest
from g4build.pins.model import load_pins
from g4build.recipes import recipe_names
from g4build.util.shellquote import bash_command, ps_command


def _show(plan: BuildPlan) -> None:
    t = plan.target
    console.print(f"[bold]{plan.pin}[/] -> vllm {plan.version} for [bold]{t.arch.name}[/] on {t.os} "
                  f"(CUDA {t.cuda}, Python {t.python}, {t.executor})")
    if plan.prerequisites:
        console.print("[bold]install first[/] (the emitted script checks each as it starts)")
        for item in plan.prerequisites:
            console.print(f"  - {item}", highlight=False, markup=False, soft_wrap=True)
    if plan.estimate:
        console.print(f"estimate: {plan.estimate}", highlight=False, markup=False, soft_wrap=True)
    env = Table(title="environment", show_header=False)
    for k, v in plan.env.items():
        env.add_row(k, v)
    console.print(env)
    console.print("[bold]steps[/]")
    for i, s in enumerate(plan.steps, 1):
        extra = "".join(f" {k}={v}" for k, v in s.env.items())
        console.print(f"{i:2d}. [bold]{s.name}[/] [dim](in {s.cwd}){extra}[/]", highlight=False)
        # quoted for the shell the plan's script runs in, so a step can be copied and run by hand
        line = ps_command(s.command) if t.os == "windows" else bash_command(s.command)
        console.print(f"    {line}", highlight=False, markup=False, soft_wrap=True)
    for n in plan.notes:
        console.print(f"note: {n}")


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
    kernels: str = typer.Option(
        "auto", "--kernels", metavar="PROFILE",
        help="vLLM's kernel set: all (the arch list's, less what no GPU of it runs), gemma4 (only the families "
             "Gemma 4 and its drafters call: a shorter build; the plan's notes name what it leaves out) or auto "
             "(the default: gemma4 for sm120 where the tree has the profile, all otherwise)."),
    flash_attn: str = typer.Option(
        "all", "--flash-attn", metavar="VERSIONS",
        help="all (FA2, and FA3 with a Hopper arch) or 2 (FlashAttention 2 alone, as an SM120 card has it)."),
    flashinfer_full: bool = typer.Option(
        False, "--flashinfer-full", help="Build FlashInfer's whole jit-cache from its git tag (every module, hours) "
        "instead of only the modules the launch recipes load (the default)."),
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
    if emit_script is not None:
        output_file(emit_script, "--emit-script")
    elif out is not None and not dry_run:  # a build here writes there (an emitted script's --out is the target's)
        output_folder(Path(out), "--out")
    planned = plan_wheel(WheelRequest(
        arch=arch, os_name=os_name, pin_name=pin_name, release=release, python=python, python_exe=python_exe,
        cuda=cuda, executor=executor, out=out, root=root, torch_index=torch_index, jobs=jobs,
        flashinfer=not no_flashinfer,
        flashinfer_full=flashinfer_full, flashinfer_wheels=tuple(flashinfer_wheels or ()), sccache=sccache,
        recipes=tuple(recipe_names()) if recipes else (), run_here=not dry_run and emit_script is None,
        kernels=kernels.lower(), flash_attn=flash_attn.lower()))
    plan = planned.plan
    if emit_script is not None:
        with writing(emit_script, "--emit-script"):
            shell = write_script(plan, emit_script)
        err_console.print(f"wrote {emit_script} ({shell})")
    if dry_run or emit_script is not None:
        if as_json:
            print_json(plan.to_dict())
        elif dry_run:
            _show(plan)
        return
    result, wheels = build_wheel(planned, clean=clean)
    if as_json:
        print_json({**plan.to_dict(), "wheels": wheels, "result": [s.__dict__ for s in result.steps]})
    else:
        console.print(f"built in {result.seconds:.0f}s; wheels in {wheels}")


def prefetch_cmd(
    tree: Path = typer.Option(..., "--tree", exists=True, file_okay=False, help="A vLLM source tree."),
    cache: Path | None = typer.Option(None, "--cache", help="Where the dependencies are kept."),
    write: Path | None = typer.Option(None, "--write", help="Write a CMake initial-cache file (cmake -C) here."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Clone the tree's CMake FetchContent dependencies once, so builds need no network."""
    if write is not None:  # before the clones: exit 2, not an OSError after them
        output_file(write, "--write")
    done = prefetch_all(tree, cache, write=write,
                        each=lambda dep: err_console.status(f"prefetch {dep.name} @ {dep.tag}"))
    rows = [p.to_dict() for p in done]
    if as_json:
        print_json(rows)
    else:
        for r in rows:
            console.print(f"{r['name']} @ {r['tag']}: {r['path']}")


def build_order_cmd(
    pin: str = typer.Option(..., "--pin", help="The pin being built."),
    arch: str = typer.Option(..., "--arch", help="The arch it is built for (sm120 ...)."),
    write: Path = typer.Option(..., "--write", help="Folder for the ninja wrapper (CMAKE_MAKE_PROGRAM names it)."),
) -> None:
    """Write the ninja wrapper that starts the pin's recorded longest compile units first."""
    from g4build.builder.ninjaorder import write_wrapper
    from g4build.data import patches_dir

    console.print(write_wrapper(write, patches_dir(), load_pins().get(pin).name, arch))


def cuda_shim(
    dest: Path = typer.Option(..., "--dest", help="Folder for the private cuda.h."),
    cuda_home: Path | None = typer.Option(None, "--cuda-home", help="CUDA install folder (default: CUDA_HOME)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Make cuda.h's CUtensorMap alignment acceptable to MSVC for the build (CUDA 13.0-13.2 on Windows):
    a private copy when the installed header needs it; nothing when it is already patched or newer."""
    output_folder(dest, "--dest")
    result = apply_cuda_shim(resolve_cuda_home(cuda_home), dest)
    if as_json:
        print_json(result.to_dict())
    else:
        console.print(result.message(), markup=False, highlight=False)


def flashinfer_wheels_cmd(
    pin_name: str | None = typer.Option(None, "--pin"),
    out: Path = typer.Option(..., "--out", help="Folder of the build's wheels."),
    wheels: list[str] = typer.Option(..., "--wheel", metavar="PATH=SHA256",
                                     help="A FlashInfer wheel (repeatable)."),
    python: str = typer.Option("3.12", "--python", help="Python X.Y the build is for."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Check Windows FlashInfer wheels (name, version, sha256) and copy them beside the vLLM wheel."""
    pin = load_pins().get(pin_name)
    specs = [parse_spec(item) for item in wheels]
    check_names(specs, pin, python)
    output_folder(out, "--out")
    records = verify_and_copy(specs, out)
    if as_json:
        print_json({"out": str(out), "wheels": records})
    else:
        for r in records:
            console.print(f"{r['file']}: sha256 {r['sha256']} ok, in {out}", markup=False, highlight=False)


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
    kernels: str | None = typer.Option(None, "--kernels", help="The build's kernel profile (recorded)."),
    flash_attn: str | None = typer.Option(None, "--flash-attn", help="The build's FlashAttention choice (recorded)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Write build-manifest.json beside the wheels and into the vLLM wheel's dist-info."""
    pin = load_pins().get(pin_name)
    manifest, touched = write_build_manifest(pin, out, state=state, arch=arch, os_name=os_name, cuda=cuda,
                                             flashinfer_wheels=flashinfer_wheels or (),
                                             kernels=kernels, flash_attn=flash_attn)
    if as_json:
        print_json({"out": str(out), "wheels_stamped": touched, "manifest": manifest})
    else:
        console.print(f"wrote {out / 'build-manifest.json'}; stamped {', '.join(touched) or 'no vLLM wheel'}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("wheel")(wheel)
    app.command("prefetch")(prefetch_cmd)
    app.command("build-order")(build_order_cmd)
    app.command("cuda-shim")(cuda_shim)
    app.command("flashinfer-wheels")(flashinfer_wheels_cmd)
    app.command("manifest")(manifest_cmd)
