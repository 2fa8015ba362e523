"""Whether a wheel fits the launch script it is rendered into.

Two questions, both answered from what the wheel says about itself (never by running it):

- platform (``platform_finding``): the script installs the wheel with pip on the machine it runs on. A PowerShell
  script runs on Windows, where pip refuses a ``manylinux``/``linux`` wheel: found out only at launch, so
  rendering refuses it (exit 11) with the routes that do work. A bash script is for WSL and Linux, where pip
  refuses a ``win_amd64`` wheel: a warning (a Windows bash could still install it).
- arch (``arch_warning``): a wheel whose ``build-manifest.json`` records a g4build build for the recipe's arch has
  native kernels for it (the build validated them). Any other wheel (a registry wheel, an overlay of one, a fork's
  wheel) may not: the registry's Linux wheels carry FlashAttention 2 as sm_80 code only, which an SM120 card
  JIT-compiles at every cold start. Rendering warns and names the command that finds out.
"""

from __future__ import annotations

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from g4build.errors import UsageError
from g4build.recipes.findings import Finding, WheelInfo
from g4build.recipes.script import Shell
from g4build.validate.fatbin import Arch


def wheel_platforms(filename: str) -> frozenset[str]:
    """The platform tags of a wheel's file name (``manylinux_2_31_x86_64``, ``win_amd64``, ``any``)."""
    try:
        _name, _version, _build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise UsageError(f"--wheel {filename}: expected a wheel file name (name-version-python-abi-platform.whl), "
                         f"found {filename!r}", hint="pass the .whl file as pip or g4build wrote it") from exc
    return frozenset(tag.platform for tag in tags)


def platform_finding(filename: str, shell: Shell) -> Finding | None:
    """An error when pip on Windows cannot install the wheel a PowerShell script installs; a warning for a
    non-Linux wheel in a bash script (bash runs on Windows too, as Git Bash or MSYS, but g4build's bash scripts
    are for WSL and Linux)."""
    platforms = wheel_platforms(filename)
    if "any" in platforms:
        return None
    windows = any(p.startswith("win") for p in platforms)
    linux = any(p.startswith(("manylinux", "musllinux", "linux")) for p in platforms)
    shown = ", ".join(sorted(platforms))
    if shell == "powershell" and not windows:
        return Finding(
            rule="wheel-platform", severity="error",
            message=f"--wheel {filename} is a {'Linux' if linux else 'non-Windows'} wheel ({shown}), but a "
                    "PowerShell launch script installs it on Windows, where pip refuses it",
            hint="on Windows install a Windows wheel: overlay a Windows fork's win_amd64 wheel "
                 "(`g4build overlay FORK.whl --pin PIN`) or build one (`g4build wheel --arch sm120 --os windows`); "
                 "or keep this wheel and render `--shell bash` to run it in WSL")
    if shell == "bash" and not linux:
        return Finding(
            rule="wheel-platform", severity="warning",
            message=f"--wheel {filename} is a {'Windows' if windows else 'non-Linux'} wheel ({shown}): pip in WSL "
                    "or on Linux refuses it; this bash script can install it only in a Windows bash (Git Bash)",
            hint="render `--shell powershell` for this wheel and run it on Windows; for WSL/Linux use a "
                 "manylinux wheel (`g4build overlay --pin PIN`, or `g4build wheel --arch sm120 --os wsl`)")
    return None


def arch_warning(info: WheelInfo, arch: str, filename: str, shown: str | None = None) -> Finding | None:
    """A warning unless the wheel's manifest records a g4build build for ``arch`` (the recipe's card). ``shown``:
    the wheel's path as the user gave it, so the command the hint names finds it from where they stand."""
    built_for: Arch | None = None
    if info.route == "build" and info.arch:
        try:
            built_for = Arch.parse(info.arch)
        except ValueError:
            built_for = None
    wanted = Arch.parse(arch)
    if built_for is not None and built_for.number == wanted.number:
        return None
    os_name = "windows" if any(p.startswith("win") for p in wheel_platforms(filename)) else "linux"
    why = (f"built by g4build for {info.arch}" if info.route == "build" else
           "an overlay: its compiled kernels are the source wheel's" if info.route == "overlay" else
           "not built by g4build (no build-manifest.json)")
    return Finding(
        rule="wheel-arch", severity="warning",
        message=f"{filename} is {why}; whether its kernels run natively on {arch} is not known here (the "
                "registry's Linux wheels carry FlashAttention 2 as sm_80 code only: the driver JIT-compiles it at "
                "every cold start)",
        hint=f"`g4build validate {shown or filename} --arch {arch}` says; build natively with "
             f"`g4build wheel --arch {arch} --os {os_name}`" + ("" if os_name == "windows" else " (`--os wsl` in WSL)"))
