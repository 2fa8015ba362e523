"""The Windows route as a user runs it: the emitted PowerShell read through the real grammar, the plan's
order, and the one-line Python programs of the plan run for real."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from g4build.builder.checkprogs import python_check, torch_check
from g4build.builder.plan import Options
from g4build.builder.planner import default_layout, make_plan
from g4build.builder.script import render_powershell
from g4build.pins.model import Pin

from . import ps_tree
from .conftest import run_cli, target


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return run_cli(argv, capsys)


def _windows_plan(pin: Pin, opts: Options = Options(jobs=4)):  # type: ignore[no-untyped-def]
    t = target("windows")
    return make_plan(pin, [], t, layout=default_layout(pin, t, base=""), opts=opts)


def _first(items: list[ps_tree.Command], name: str) -> int:
    return min(c.index for c in items if c.name == name)


# --- 1. the build runs the active venv's python ---------------------------------------------------------------


def test_windows_plan_runs_the_active_venvs_python(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(["wheel", "--arch", "sm120", "--os", "windows", "--dry-run", "--json"], capsys)
    assert code == 0
    steps = json.loads(out)["steps"]
    pythons = {s["command"][0] for s in steps if s["command"][0] not in ("g4build", "git")}
    assert pythons == {"python"}  # never `py -3.12`: it bypasses the venv and installs globally
    assert steps[0]["name"] == "python" and steps[0]["command"][-1] == "--venv"  # checked: a venv's
    exes = {s["command"][s["command"].index("--python-exe") + 1] for s in steps if "build-check" in s["command"]}
    assert exes == {"python"}
    code, out, _ = _cli(["wheel", "--arch", "sm120", "--os", "windows", "--dry-run", "--json",
                         "--python-exe", "D:\\venvs\\b\\Scripts\\python.exe"], capsys)
    assert code == 0
    steps = json.loads(out)["steps"]
    assert steps[0]["command"][-1] != "--venv"  # an interpreter named by path needs no active venv
    assert {s["command"][0] for s in steps if s["command"][0] not in ("g4build", "git")} == \
        {"D:\\venvs\\b\\Scripts\\python.exe"}


def test_python_check_runs_for_real() -> None:
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert sys.prefix != sys.base_prefix, "the tests run in a venv"
    base = Path(sys.base_prefix) / "bin" / f"python{here}"
    if not base.is_file():
        pytest.skip(f"no base interpreter at {base}")

    def run(exe: str | Path, version: str, need_venv: bool) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(exe), "-c", python_check(version, need_venv=need_venv)], capture_output=True,
                              text=True, check=False)

    assert run(sys.executable, here, True).returncode == 0
    outside = run(base, here, True)
    assert outside.returncode == 1
    assert "not a virtual environment" in outside.stderr and str(base) in outside.stderr
    assert "create a venv with Python" in outside.stderr
    assert run(base, here, False).returncode == 0  # an interpreter named by path need not be a venv
    wrong = run(sys.executable, "3.99", True)
    assert wrong.returncode == 1 and f"(Python {here})" in wrong.stderr and "Python 3.99" in wrong.stderr


def test_emitted_script_stops_without_an_active_venv(pin21: Pin) -> None:
    tree = ps_tree.parse(render_powershell(_windows_plan(pin21)))
    venv = [g for g in ps_tree.guards(tree) if "$env:VIRTUAL_ENV" in g.condition]
    assert len(venv) == 1 and venv[0].condition.startswith("-not")
    assert "no virtual environment is active" in venv[0].message
    assert "py -3.12 -m venv" in venv[0].message and "Activate.ps1" in venv[0].message
    cmds = ps_tree.commands(tree)
    assert venv[0].index < _first(cmds, "Invoke-Step")
    assert venv[0].index < min(c.index for c in cmds if c.name.endswith("vswhere.exe"))
    named = _windows_plan(pin21, Options(jobs=4, python=("C:\\v\\Scripts\\python.exe",),
                                         python_exe="C:\\v\\Scripts\\python.exe"))
    assert not [g for g in ps_tree.guards(ps_tree.parse(render_powershell(named))) if "VIRTUAL_ENV" in g.condition]


# --- 2. the CUDA torch of the pin's CUDA line first -----------------------------------------------------------


def test_torch_is_installed_and_checked_before_anything_that_needs_it(pin21: Pin,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(["wheel", "--arch", "sm120", "--os", "windows", "--dry-run", "--json", "--torch-index",
                         "https://torch.example.invalid/whl/{cu}"], capsys)
    assert code == 0
    steps = json.loads(out)["steps"]
    names = [s["name"] for s in steps]
    assert names.index("torch-install") < names.index("torch") < names.index("windows-requirements")
    assert names.index("torch") < names.index("use-existing-torch") < names.index("windows-requirements")
    assert names.index("windows-requirements") < names.index("build-requirements") < names.index("torch-kept") \
        < names.index("vllm")
    install = steps[names.index("torch-install")]["command"]
    assert install[1:] == ["-m", "pip", "install", f"torch=={pin21.torch}", "--index-url",
                           "https://torch.example.invalid/whl/cu130"]
    code, out, _ = _cli(["wheel", "--arch", "sm120", "--os", "windows", "--dry-run"], capsys)
    # the order is visible in the printed plan too
    assert out.index(" torch ") < out.index("windows-requirements") < out.index("torch-kept")


def _torch_standin(folder: Path, version: str, cuda: str | None) -> Path:
    """A module named torch answering what the check reads (``__version__``, ``version.cuda``) as torch does."""
    pkg = folder / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        f"import types\n__version__ = {version!r}\nversion = types.SimpleNamespace(cuda={cuda!r})\n")
    return folder


def test_torch_check_wants_the_pins_cuda_line(tmp_path: Path) -> None:
    code = torch_check("2.11.0", "13.0")

    def run(path: Path | None) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", ""), **({"PYTHONPATH": str(path)} if path else {})}
        return subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=False,
                              env=env)

    assert run(_torch_standin(tmp_path / "a", "2.11.0+cu130", "13.0.2")).returncode == 0
    older = run(_torch_standin(tmp_path / "b", "2.11.0+cu129", "12.9"))
    assert older.returncode == 1 and "built for CUDA 12.9" in older.stderr and "cu130 wheel index" in older.stderr
    other = run(_torch_standin(tmp_path / "c", "2.10.0+cu130", "13.0"))
    assert other.returncode == 1 and "expected torch 2.11.0 built for CUDA 13.0" in other.stderr
    try:
        import torch
    except ImportError:
        return
    if torch.version.cuda is None:  # the test venv's real CPU torch: what PyPI gives on Windows
        cpu = subprocess.run([sys.executable, "-c", torch_check(torch.__version__.split("+")[0], "13.0")],
                             capture_output=True, text=True, check=False)
        assert cpu.returncode == 1 and "without CUDA (a CPU build)" in cpu.stderr


# --- 10. CUDA_HOME, CUDA_PATH and PATH name one CUDA -----------------------------------------------------------


def test_script_sets_cuda_home_cuda_path_and_path(pin21: Pin) -> None:
    tree = ps_tree.parse(render_powershell(_windows_plan(pin21)))
    sets = {a.target: a for a in ps_tree.assignments(tree)}
    assert sets["$env:CUDA_HOME"].value == "$env:CUDA_PATH_V13_0"
    assert sets["$env:CUDA_PATH"].value == "$env:CUDA_HOME"
    assert sets["$env:PATH"].value == "(Join-Path $env:CUDA_HOME 'bin') + ';' + $env:PATH"  # the toolkit's bin first
    vcvars = next(st.index for st in ps_tree.statements(tree) if "vcvars64.bat" in st.text)
    home_known = max(g.index for g in ps_tree.guards(tree) if "nvcc.exe" in g.message)
    # after vcvars64 (it puts its own folders first) and after CUDA_HOME is known to hold nvcc
    assert vcvars < home_known < sets["$env:CUDA_PATH"].index <= sets["$env:PATH"].index
    assert sets["$env:PATH"].index < _first(ps_tree.commands(tree), "Invoke-Step")


def test_native_windows_environment_names_one_cuda() -> None:
    from g4build.builder.platforms.windows import cuda_env, parse_set_output

    # the shape vcvars64's `set` leaves: Windows spells it Path
    vc = parse_set_output("Path=C:\\VS\\VC\\bin;C:\\Windows\\system32\r\nINCLUDE=C:\\VS\\include\r\n")
    env = cuda_env(vc, "C:\\CUDA\\v13.0\\")
    assert env["CUDA_HOME"] == env["CUDA_PATH"] == "C:\\CUDA\\v13.0\\"
    assert env["PATH"].split(";") == ["C:\\CUDA\\v13.0\\bin", "C:\\VS\\VC\\bin", "C:\\Windows\\system32"]
    assert "Path" not in env and env["INCLUDE"] == "C:\\VS\\include"


# --- 6. Visual Studio 2022, not the newest one ----------------------------------------------------------------


def test_script_selects_visual_studio_2022_or_stops(pin21: Pin) -> None:
    tree = ps_tree.parse(render_powershell(_windows_plan(pin21)))
    [vswhere] = [c for c in ps_tree.commands(tree) if c.name.endswith("vswhere.exe")]
    args = vswhere.args
    assert args[args.index("-version") + 1] == "[17.0,18.0)"
    assert args[args.index("-requires") + 1] == "Microsoft.VisualStudio.Component.VC.Tools.x86.x64"
    [absent] = [g for g in ps_tree.guards(tree) if g.condition == "-not $vs"]
    assert absent.index == vswhere.index + 1
    assert absent.message.startswith("Visual Studio 2022 (17.x) with the C++ x64 tools was not found")
    assert "'Desktop development with C++' workload" in absent.message  # the quotes survive PowerShell quoting
    [no_installer] = [g for g in ps_tree.guards(tree) if "Test-Path" in g.condition and "vswhere" in g.condition]
    assert no_installer.index < vswhere.index and "vswhere.exe not found" in no_installer.message
    vcvars = next(st.index for st in ps_tree.statements(tree) if "vcvars64.bat" in st.text)
    assert absent.index < vcvars


# --- 7. MAX_JOBS from the real RAM on Windows ------------------------------------------------------------------


def test_memorystatusex_layout_gives_the_installed_ram() -> None:
    import ctypes

    from g4build.builder.probe import MemoryStatusEx, total_physical

    lines = (Path(__file__).parent / "fixtures" / "memorystatusex-64gib.hex").read_text().splitlines()
    raw = bytes.fromhex(lines[-1])
    assert ctypes.sizeof(MemoryStatusEx) == 64  # what GlobalMemoryStatusEx checks dwLength against
    assert total_physical(raw) == 68_542_193_664
    assert total_physical(raw[:40]) is None
    assert total_physical(b"\x20" + raw[1:]) is None  # dwLength not 64: not a filled MEMORYSTATUSEX


def test_windows_host_facts_use_the_machines_ram(tmp_path: Path) -> None:
    from tests.unit.doctor.recorded import RecordedProbe

    from g4build.builder.host import mem_gb, probe
    from g4build.builder.plan import max_jobs
    from g4build.builder.request import machine_choices

    windows = RecordedProbe("windows-5090-cuda129")  # 64 GiB, 32 logical cores, as GlobalMemoryStatusEx said
    assert windows.system == "windows"
    assert mem_gb(windows) == pytest.approx(68.72, abs=0.01)
    facts = probe(str(tmp_path), windows)
    assert facts.cores == 32 and facts.mem_gb == pytest.approx(68.72, abs=0.01)
    here = dataclasses.replace(facts, os="windows")  # as if this machine were that one
    jobs, _, _ = machine_choices(target("windows"), here)
    assert jobs == max_jobs(mem_gb=68.72, cores=32) == 13  # ~5 GB per nvcc job, not the 3 of an assumed 16 GB


def test_script_counts_max_jobs_on_the_machine_it_runs_on(pin21: Pin, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    tree = ps_tree.parse(render_powershell(_windows_plan(pin21)))
    [block] = [st for st in ps_tree.statements(tree) if st.text.startswith("if (-not $env:MAX_JOBS)")]
    sets = {a.target: a.value for a in ps_tree.assignments(tree) if a.index == block.index}
    assert "Win32_ComputerSystem" in sets["$ram"] and "TotalPhysicalMemory" in sets["$ram"]
    assert sets["$byRam"] == "[Math]::Floor($ram / 5000000000)"  # GB_PER_NVCC_JOB GB per job
    assert "[Environment]::ProcessorCount" in sets["$env:MAX_JOBS"] and "[Math]::Max(1," in sets["$env:MAX_JOBS"]
    # --jobs is kept as given (a MAX_JOBS set in the shell still wins)
    ps1 = tmp_path / "b.ps1"
    assert _cli(["wheel", "--arch", "sm120", "--os", "windows", "--jobs", "3", "--emit-script", str(ps1)],
                capsys)[0] == 0
    fixed = ps_tree.parse(ps1.read_text(encoding="utf-8"))
    assert not [st for st in ps_tree.statements(fixed) if "TotalPhysicalMemory" in st.text]
    assert [a.value for a in ps_tree.assignments(fixed) if a.target == "$env:MAX_JOBS"] == ["'3'"]


# --- 8. no sccache on Windows unless asked for -----------------------------------------------------------------


def test_no_sccache_on_windows_unless_asked(pin21: Pin) -> None:
    found = _windows_plan(pin21, Options(jobs=4, launcher="sccache"))  # sccache on this machine's PATH
    assert found.env["VLLM_DISABLE_SCCACHE"] == "1"
    assert any(n.startswith("sccache: off on Windows") and "--sccache" in n for n in found.notes)
    tree = ps_tree.parse(render_powershell(found))
    assert [a.value for a in ps_tree.assignments(tree) if a.target == "$env:VLLM_DISABLE_SCCACHE"] == ["'1'"]
    asked = _windows_plan(pin21, Options(jobs=4, launcher=None, sccache=True))
    assert "VLLM_DISABLE_SCCACHE" not in asked.env and "sccache: on (--sccache)" in asked.notes
    t = target("linux")  # elsewhere a launcher found is still used
    linux = make_plan(pin21, [], t, layout=default_layout(pin21, t, base="/home/u/.cache/g4build"),
                      opts=Options(jobs=4, launcher="sccache"))
    assert "VLLM_DISABLE_SCCACHE" not in linux.env


def test_sccache_option_reaches_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(["wheel", "--arch", "sm120", "--os", "windows", "--dry-run", "--json", "--sccache"], capsys)
    assert code == 0 and "VLLM_DISABLE_SCCACHE" not in json.loads(out)["env"]
    code, out, _ = _cli(["wheel", "--arch", "sm120", "--os", "windows", "--dry-run"], capsys)
    assert code == 0 and "sccache: off on Windows" in " ".join(out.split())


# --- 5. long paths before the first clone -----------------------------------------------------------------------


def test_script_requires_long_paths_before_the_first_clone(pin21: Pin) -> None:
    tree = ps_tree.parse(render_powershell(_windows_plan(pin21)))
    [read] = [c for c in ps_tree.commands(tree) if c.name == "Get-ItemPropertyValue"]
    assert read.args[:4] == ("-Path", "HKLM:\\SYSTEM\\CurrentControlSet\\Control\\FileSystem", "-Name",
                             "LongPathsEnabled")
    [git] = [c for c in ps_tree.commands(tree) if c.name == "git"]
    assert git.args == ("config", "--global", "--get", "core.longpaths")
    [stop] = [g for g in ps_tree.guards(tree) if g.condition == "$fixes"]
    assert read.index < stop.index and git.index < stop.index
    assert stop.index < _first(ps_tree.commands(tree), "Invoke-Step")  # the source step clones: it comes after
    assert "long paths are off" in stop.message and "then open a new PowerShell" in stop.message
    # each fix the script prints is a command PowerShell reads as one call with exactly these arguments
    fixes = [a.literal for a in ps_tree.assignments(tree) if a.target == "$fixes" and a.literal]
    assert len(fixes) == 2
    parsed = [ps_tree.commands(ps_tree.parse(f)) for f in fixes]
    assert [(c.name, c.args) for [c] in parsed] == [
        ("reg", ("add", "HKLM\\SYSTEM\\CurrentControlSet\\Control\\FileSystem", "/v", "LongPathsEnabled", "/t",
                 "REG_DWORD", "/d", "1", "/f")),
        ("git", ("config", "--global", "core.longpaths", "true")),
    ]


@pytest.mark.parametrize(("torch", "cuda"), [
    ("2.14.0'+__import__('os').system('touch pwned')+'", "13.0"),
    ("2.14.0", "13.0'+__import__('os').system('touch pwned')+'"),
    ("2.14.0\n", "13.0"),
])
def test_torch_check_refuses_values_that_would_be_code(torch: str, cuda: str) -> None:
    from g4build.errors import ConfigError

    with pytest.raises(ConfigError, match="expected versions"):
        torch_check(torch, cuda)
