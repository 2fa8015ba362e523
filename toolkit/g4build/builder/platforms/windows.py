"""Everything g4build knows about building on native Windows (MSVC + CUDA), in one place.

- Upstream's setup.py builds nothing on win32, so the source is the pin's Windows base (a Windows-enabled
  fork at a pinned commit), onto which the series apply.
- MSVC is activated with vswhere + vcvars64; DISTUTILS_USE_SDK=1 keeps setuptools from looking for it again.
- A short build root keeps CMake's deep object paths under the 260-character limit.
- CUDA 13.0-13.2's ``cuda.h`` declares ``CUtensorMap`` with ``alignas(128)``, which MSVC refuses to pass by
  value. Instead of editing the installed header (the fork's advice, needs admin rights), the plan's cuda-shim
  step writes a private copy with a 64-byte alignment under MSVC when the installed header needs it (see
  ``cudashim``) and the build puts its folder first on the include path (``CL`` for cl.exe,
  ``NVCC_PREPEND_FLAGS`` for nvcc).

The module is a ``platforms.Platform``: its module-level functions are what the planner asks of an OS.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from packaging.version import InvalidVersion, Version

from g4build.builder.flashinfer import FlashInferWheel
from g4build.builder.plan import Layout, Options, Step, Target
from g4build.builder.steps import exe_words
from g4build.errors import BuildError, UsageError
from g4build.pins.model import Pin
from g4build.util.shellquote import ps_quote

NAME = "windows"
SCRIPT = "powershell"
ROOT = "C:\\g4b"
MAX_ROOT_CHARS = 24  # vLLM's deepest object paths add ~200 characters below the source tree
VSWHERE = "${env:ProgramFiles(x86)}\\Microsoft Visual Studio\\Installer\\vswhere.exe"
# CUDA 12.8-13.0 support the MSVC of Visual Studio 2022 (17.x); a newer one makes nvcc refuse the host compiler,
# so `-latest` alone could pick the wrong one where both are installed. The range takes the newest 2022.
VS_VERSION_RANGE = "[17.0,18.0)"
VC_TOOLS = "Microsoft.VisualStudio.Component.VC.Tools.x86.x64"  # the C++ x64 tools of the C++ workload
_VSWHERE_ARGS = ("-latest", "-products", "*", "-version", VS_VERSION_RANGE, "-requires", VC_TOOLS,
                 "-property", "installationPath")
NO_VS2022 = ("Visual Studio 2022 (17.x) with the C++ x64 tools was not found: CUDA 13.0 supports the MSVC of "
             "Visual Studio 2022 only, a newer one breaks nvcc. Install Visual Studio 2022 Build Tools with the "
             "'Desktop development with C++' workload (a newer Visual Studio may stay beside it), then rerun")


LONG_PATHS_KEY = r"HKLM\SYSTEM\CurrentControlSet\Control\FileSystem"
# the exact fixes, each a command that works in PowerShell and cmd alike; the first needs an administrator
LONG_PATHS_FIX = rf"reg add {LONG_PATHS_KEY} /v LongPathsEnabled /t REG_DWORD /d 1 /f"
GIT_LONG_PATHS_FIX = "git config --global core.longpaths true"


def long_paths_lines() -> tuple[str, ...]:
    """Script lines that stop before the first clone unless Windows and git both allow paths past 260
    characters (vLLM's CMake dependencies and the fork's tree have them), printing the commands that fix it."""
    hive, _, key = LONG_PATHS_KEY.partition("\\")
    return (
        "$fixes = @()",
        f"$longPaths = Get-ItemPropertyValue -Path {ps_quote(hive + ':' + chr(92) + key)} -Name 'LongPathsEnabled' "
        "-ErrorAction SilentlyContinue",
        f"if ($longPaths -ne 1) {{ $fixes += {ps_quote(LONG_PATHS_FIX)} }}",
        f"if ((git config --global --get core.longpaths) -ne 'true') {{ $fixes += {ps_quote(GIT_LONG_PATHS_FIX)} }}",
        "if ($fixes) {",
        "  throw ('long paths are off: expected Windows LongPathsEnabled=1 and git core.longpaths=true (CUTLASS, '"
        " + 'FlashAttention and the fork have paths past 260 characters). Run (reg in a PowerShell run as '"
        " + 'administrator):' + \"`n  \" + ($fixes -join \"`n  \")"
        " + \"`n\" + 'then open a new PowerShell and run this script again')",
        "}",
    )


def is_vs2022(version: str) -> bool:
    """``installationVersion`` of a Visual Studio 2022 instance (vswhere's -version [17.0,18.0))."""
    try:
        return Version("17.0") <= Version(version) < Version("18.0")
    except InvalidVersion:
        return False


def needs_align_shim(cuda: str) -> bool:
    v = Version(cuda)
    return Version("13.0") <= v < Version("13.3")


def default_layout(pin: Pin, target: Target, *, base: str) -> Layout:
    """A short root on C: (``base``, the cache folder, is not used: its paths are too long for CMake)."""
    short = pin.version.replace(".", "")
    root = f"{ROOT}\\v{short}"
    return Layout(root=root, out=f"{ROOT}\\wheels", cache=f"{ROOT}\\deps", sep="\\")


def python_cmd(target: Target, exe: str | None) -> tuple[str, ...]:
    # not `py -3.12`: the launcher with a version picks the global install past an active venv, so every
    # install would land there; `python` is the active venv's own interpreter (first on PATH once activated)
    return (exe,) if exe else ("python",)


def venv_lines(python: str, *, explicit: bool) -> tuple[str, ...]:
    """Script lines that stop before anything runs when no venv is active (unless an interpreter was named)."""
    if explicit:
        return ()
    v = python
    return (
        "if (-not $env:VIRTUAL_ENV) {",
        f"  throw ('no virtual environment is active: expected one with Python {v}, so the build does not install '"
        f" + 'into the global Python. Create and activate one, then run this script again: py -{v} -m venv '"
        f" + '{ROOT}\\venv; {ROOT}\\venv\\Scripts\\Activate.ps1 (or plan with --python-exe PATH)')",
        "}",
    )


def python_step(target: Target, layout: Layout, opts: Options, *, explicit: bool) -> Step:
    """First step: the interpreter is Python X.Y and (unless named explicitly) a virtual environment's (the check
    runs through `g4build build-check python`, so the step reads as what it checks)."""
    venv = () if explicit else ("--venv",)
    return Step(name="python", title=f"check the build's Python {target.python}", resumable=False,
                command=(*opts.g4build, "build-check", "python", *exe_words(opts.python), "--version",
                         target.python, *venv), cwd=layout.root)


def resolve_options(target: Target, opts: Options) -> tuple[Options, tuple[str, ...]]:
    # cl.exe has been seen crashing under sccache, with CUDA 13 at high parallelism: off unless asked for
    where = f", units kept in {opts.cache_backend}" if opts.cache_backend else ""
    note = (f"sccache: on (--sccache){where}" if opts.sccache else
            "sccache: off on Windows (cl.exe crashes under it with CUDA 13 at high parallelism); "
            "--sccache turns it on")
    return dataclasses.replace(opts, launcher="sccache" if opts.sccache else None), (note,)


def check_layout(target: Target, layout: Layout) -> None:
    if len(layout.root) > MAX_ROOT_CHARS:
        raise UsageError(
            f"build root {layout.root!r} is {len(layout.root)} characters: expected at most {MAX_ROOT_CHARS} on "
            "Windows (CMake object paths below it pass the 260-character limit)",
            hint=f"use a short root such as {ROOT} (--root)",
        )
    for path in (layout.root, layout.cache):
        if " " in path:
            raise UsageError(f"build path {path!r} contains a space: CMAKE_ARGS cannot carry it",
                             hint=f"use a root without spaces such as {ROOT}")


def env(target: Target, layout: Layout, *, cuda_home: str | None) -> dict[str, str]:
    """``cuda_home`` is not used: the script finds CUDA on the machine it runs on (CUDA_HOME or CUDA_PATH_Vx_y)."""
    extra = {"DISTUTILS_USE_SDK": "1"}
    if needs_align_shim(target.cuda):
        shim = layout.join("cuda-shim")
        extra["CL"] = f"/I{shim}"
        extra["NVCC_PREPEND_FLAGS"] = f"-I{shim}"
    return extra


def setup_lines(target: Target, opts: Options) -> tuple[str, ...]:
    explicit_python = opts.python_exe is not None
    cuda_var = "CUDA_PATH_V" + target.cuda.replace(".", "_")
    args = " ".join(f"'{a}'" for a in _VSWHERE_ARGS)
    return (
        *venv_lines(target.python, explicit=explicit_python),
        *long_paths_lines(),
        f'if (-not (Test-Path -PathType Leaf "{VSWHERE}")) {{',
        "  throw " + ps_quote(f"vswhere.exe not found: expected the Visual Studio Installer. {NO_VS2022}"),
        "}",
        f'$vs = & "{VSWHERE}" {args}',
        f"if (-not $vs) {{ throw {ps_quote(NO_VS2022)} }}",
        "cmd /c \"`\"$vs\\VC\\Auxiliary\\Build\\vcvars64.bat`\" >nul && set\" | ForEach-Object {",
        "  if ($_ -match '^([^=]+)=(.*)$') { Set-Item -Path \"env:$($Matches[1])\" -Value $Matches[2] }",
        "}",
        f"if (-not $env:CUDA_HOME) {{ $env:CUDA_HOME = $env:{cuda_var} }}",
        f"if (-not $env:CUDA_HOME) {{ throw 'CUDA {target.cuda} not found: set CUDA_HOME or install it' }}",
        "if (-not (Test-Path -PathType Leaf (Join-Path $env:CUDA_HOME 'bin\\nvcc.exe'))) {",
        "  throw \"no bin\\nvcc.exe under CUDA_HOME=$env:CUDA_HOME: expected the CUDA toolkit's install folder\"",
        "}",
        # CMake's FindCUDAToolkit and torch read CUDA_PATH, and nvcc is found on PATH: all three name one CUDA,
        # its bin first on PATH (after vcvars64, which puts its own folders first)
        "$env:CUDA_PATH = $env:CUDA_HOME",
        "$env:PATH = (Join-Path $env:CUDA_HOME 'bin') + ';' + $env:PATH",
    )


def cuda_env(env: dict[str, str], cuda_home: str) -> dict[str, str]:
    """``env`` with CUDA_HOME, CUDA_PATH naming ``cuda_home`` and its ``bin`` first on PATH (as the script)."""
    path = env.get("PATH") or env.get("Path") or ""
    rest = [p for p in path.split(";") if p]
    bin_dir = cuda_home.rstrip("\\") + "\\bin"
    out = {k: v for k, v in env.items() if k != "Path"}
    out.update(CUDA_HOME=cuda_home, CUDA_PATH=cuda_home, PATH=";".join([bin_dir, *rest]))
    return out


def pre_steps(pin: Pin, target: Target, layout: Layout, opts: Options) -> tuple[Step, ...]:
    """Before the source: the interpreter check, then the FlashInfer wheels given (checked before hours of work)."""
    return (python_step(target, layout, opts, explicit=opts.python_exe is not None),
            *flashinfer_steps(pin, target, layout, opts.g4build, opts.flashinfer_wheels))


def source_steps(pin: Pin, layout: Layout, g4build: tuple[str, ...]) -> tuple[Step, ...]:
    base = pin.bases["windows"]
    how = (f"forward-port the Windows fork {base.commit[:12]} onto {pin.name}" if base.onto
           else f"clone the Windows fork at {base.commit[:12]}")
    return (Step(name="source", title=how,
                 command=(*g4build, "source", "fetch", "--pin", pin.name, "--os", "windows", "--dest", layout.src),
                 cwd=layout.root, fresh=layout.src),)


def flashinfer_steps(pin: Pin, target: Target, layout: Layout, g4build: tuple[str, ...],
                     wheels: Sequence[FlashInferWheel]) -> tuple[Step, ...]:
    """With Windows FlashInfer wheels given: check each sha256 and copy them beside the vLLM wheel, before the
    hours of compiling (a wrong file stops the build at once)."""
    if not wheels:
        return ()
    args = [a for w in wheels for a in ("--wheel", w.spec())]
    return (Step(name="flashinfer-wheels", title=f"check and copy the FlashInfer {pin.flashinfer} Windows wheels",
                 resumable=False, command=(*g4build, "flashinfer-wheels", "--pin", pin.name, "--python",
                                           target.python, "--out", layout.out, *args), cwd=layout.root),)


def flashinfer_note(pin: Pin, wheels: Sequence[FlashInferWheel]) -> str:
    if wheels:
        return (f"FlashInfer: the Windows wheels given ({', '.join(w.filename for w in wheels)}), sha256-checked "
                "first, copied beside the vLLM wheel and recorded in build-manifest.json; launch scripts install "
                "them with it")
    return ("FlashInfer: none (the Windows base keeps the pin's requirements/cuda.txt, and the recipes' modules are "
            "not compiled here: FlashInfer's JIT build, which the scoped Linux build drives, writes Linux ninja "
            "rules only (nvcc -shared into NAME.so, -L$cuda_home/lib64, no cl.exe or .dll), so a Windows build of "
            "them needs MSVC, CUDA and that build ported, which FlashInfer does not have): the launch scripts turn "
            "every FlashInfer path off. To have it, pass --flashinfer-wheel PATH=SHA256 with Windows wheels of "
            f"FlashInfer {pin.flashinfer}")


def extra_steps(target: Target, layout: Layout, opts: Options) -> tuple[Step, ...]:
    steps = [Step(name="windows-requirements", title="install the fork's Windows requirements",
                  command=(*opts.python, "-m", "pip", "install", "-r", "requirements/windows.txt"),
                  cwd=layout.src)]
    if needs_align_shim(target.cuda):
        steps.append(Step(name="cuda-shim", title="cuda.h with MSVC-safe alignment",
                          command=(*opts.g4build, "cuda-shim", "--dest", layout.join("cuda-shim")), cwd=layout.root))
    return tuple(steps)


def notes(pin: Pin, target: Target, layout: Layout, opts: Options) -> tuple[str, ...]:
    base = pin.bases["windows"]
    out = [f"source: Windows base {base.remote} at {base.commit}"
           + (f", its changes over {base.onto[:12]} forward-ported onto {pin.name}" if base.onto else ""),
           flashinfer_note(pin, opts.flashinfer_wheels)]
    if needs_align_shim(target.cuda):
        out.append(f"CUDA {target.cuda} + MSVC: cuda-shim gives the build a private cuda.h with 64-byte "
                   "CUtensorMap alignment when the installed one needs it (already patched or 13.3+: none); "
                   "run-time JIT reads the installed header")
    return tuple(out)


def jobs_from_machine(opts: Options) -> bool:
    """Unless --jobs fixed it, the PowerShell script counts the RAM and cores of the machine it runs on."""
    return not opts.jobs_given


# --- side effects: only on a Windows machine --------------------------------------------------------------

def parse_set_output(text: str) -> dict[str, str]:
    """``cmd /c set`` output -> environment mapping."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and not key.startswith("="):
            result[key] = value
    return result


def msvc_environment(cuda: str) -> dict[str, str]:
    """Run vswhere + vcvars64 and return the environment they leave (plus CUDA_HOME)."""
    vswhere = Path(os.environ.get("PROGRAMFILES(X86)", r"C:\Program Files (x86)")) / \
        "Microsoft Visual Studio" / "Installer" / "vswhere.exe"
    if not vswhere.is_file():
        raise BuildError(f"vswhere not found at {vswhere}: expected Visual Studio 2019 or newer",
                         hint="install Visual Studio Build Tools with 'Desktop development with C++'")
    found = subprocess.run([str(vswhere), *_VSWHERE_ARGS], capture_output=True, text=True, check=False)
    vs = found.stdout.strip().splitlines()[0] if found.stdout.strip() else ""
    if not vs:
        message, _, hint = NO_VS2022.partition(". Install")
        raise BuildError(message, hint="install" + hint)
    vcvars = Path(vs) / "VC" / "Auxiliary" / "Build" / "vcvars64.bat"
    out = subprocess.run(f'cmd /c ""{vcvars}" >nul && set"', capture_output=True, text=True, check=False,
                         shell=True)
    env = parse_set_output(out.stdout)
    if "VCToolsInstallDir" not in env:
        raise BuildError(f"{vcvars} did not set up MSVC: {out.stderr.strip()[-300:]}")
    cuda_var = "CUDA_PATH_V" + cuda.replace(".", "_")
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get(cuda_var)
    if not cuda_home:
        raise BuildError(f"CUDA {cuda} not found: neither CUDA_HOME nor {cuda_var} is set",
                         hint=f"install CUDA {cuda} or set CUDA_HOME")
    return cuda_env(env, cuda_home)
