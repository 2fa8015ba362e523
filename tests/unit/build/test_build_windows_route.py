"""The Windows route as a user runs it: the emitted PowerShell read through the real grammar, the plan's
order, and the one-line Python programs of the plan run for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from g4build.build.plan import Options, python_check
from g4build.build.planner import default_layout, make_plan
from g4build.build.script import render_powershell
from g4build.cli import main
from g4build.pins import Pin

from . import ps_tree
from .conftest import target


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


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
    assert steps[0]["name"] == "python" and "sys.base_prefix" in steps[0]["command"][-1]
    code, out, _ = _cli(["wheel", "--arch", "sm120", "--os", "windows", "--dry-run", "--json",
                         "--python-exe", "D:\\venvs\\b\\Scripts\\python.exe"], capsys)
    assert code == 0
    steps = json.loads(out)["steps"]
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
