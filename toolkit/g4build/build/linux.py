"""Linux and WSL: GCC + CUDA from the system (or a CUDA devel image). One module for both; WSL adds its rules.

WSL specifics: build inside the Linux file system (``/mnt/c`` is slow and case-insensitive), and RAM is
WSL's share of the host (half by default, set in ``.wslconfig``), which is what MAX_JOBS is chosen from.
"""

from __future__ import annotations

from g4build.build.plan import Layout, Step, Target
from g4build.errors import UsageError
from g4build.pins import Pin

SCRIPT = "bash"


def default_layout(pin: Pin, target: Target, *, base: str) -> Layout:
    root = f"{base.rstrip('/')}/build/{pin.name}-{target.arch.name}"
    return Layout(root=root, out=f"{root}/wheels", cache=f"{base.rstrip('/')}/deps", sep="/")


def python_cmd(version: str, exe: str | None = None) -> tuple[str, ...]:
    return (exe,) if exe else (f"python{version}",)


def check_layout(os_name: str, layout: Layout) -> None:
    for path in (layout.root, layout.cache):
        if any(c.isspace() for c in path):
            raise UsageError(f"build path {path!r} contains white space: CMAKE_ARGS cannot carry it",
                             hint="choose a root without spaces (--root)")
    if os_name == "wsl" and layout.root.startswith("/mnt/"):
        raise UsageError(
            f"build root {layout.root} is on a Windows drive: expected a path in WSL's own file system",
            hint="use --root ~/g4b (builds on /mnt/c are slow and hit case-insensitivity problems)",
        )


def env(target: Target, layout: Layout, *, cuda_home: str | None) -> dict[str, str]:
    return {"CUDA_HOME": cuda_home or f"/usr/local/cuda-{target.cuda}"}


def source_steps(pin: Pin, layout: Layout, g4build: tuple[str, ...]) -> tuple[Step, ...]:
    return (Step(name="source", title=f"fetch and verify {pin.name}",
                 command=(*g4build, "source", "fetch", "--pin", pin.name, "--from", "sdist", "--dest", layout.src),
                 cwd=layout.root, fresh=layout.src),)
