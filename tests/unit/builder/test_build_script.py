"""Emitted scripts: bash runs for real (resume and G4BUILD_CLEAN), PowerShell parses (tree-sitter grammar)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from g4build.builder.plan import Layout, Options
from g4build.builder.planner import default_layout, make_plan
from g4build.builder.script import render, render_bash, render_powershell
from g4build.pins.model import Pin

from .conftest import target


def _echo_plan(pin: Pin, root: Path):  # type: ignore[no-untyped-def]
    """A real plan whose tools are `echo` (logged to a file), so bash can run every step here."""
    log = root / "calls.log"
    tool = root / "tool.sh"
    root.mkdir(parents=True, exist_ok=True)
    tool.write_text(f'#!/bin/sh\necho "$* [MAX_JOBS=$MAX_JOBS ARCH=$TORCH_CUDA_ARCH_LIST]" >> {log}\n')
    tool.chmod(0o755)
    lay = Layout(root=str(root / "b"), out=str(root / "b" / "wheels"), cache=str(root / "deps"))
    opts = Options(jobs=3, flashinfer=False, g4build=(str(tool), "g4build"), python=(str(tool), "py"))
    return make_plan(pin, [], target("linux"), layout=lay, opts=opts), log


def test_bash_script_runs_resumes_and_cleans(tmp_path: Path, pin21: Pin) -> None:
    plan, log = _echo_plan(pin21, tmp_path)
    script = tmp_path / "build.sh"
    script.write_text(render_bash(plan))
    env = {k: v for k, v in os.environ.items() if k != "MAX_JOBS"}
    first = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, check=True)
    calls = log.read_text().splitlines()
    assert len(calls) == len(plan.steps)
    assert calls[0].startswith("g4build source fetch --pin vllm-0.21.0")
    assert "[MAX_JOBS=3 ARCH=12.0f]" in calls[0]
    assert "== vllm: done" in first.stdout
    from g4build.emit.manifest_info import build_extra

    timings = build_extra(arch="sm120", os_name="linux", cuda="13.0", state=Path(plan.layout.state_file))["timings"]
    assert set(timings) == {s.name for s in plan.steps}  # every step's seconds reach build-manifest.json
    assert all(isinstance(v, float) and v >= 0 for v in timings.values())
    built = Path(plan.layout.src) / "built-object.o"  # what a build leaves in the tree
    built.parent.mkdir(parents=True, exist_ok=True)
    built.write_text("")
    second = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, check=True)
    assert "== vllm: finished before, skipped" in second.stdout
    assert built.is_file()  # a skipped source step keeps the tree
    resumed = log.read_text().splitlines()[len(calls):]
    assert {c.split()[0] + " " + c.split()[1] for c in resumed} == {"g4build build-check", "g4build validate",
                                                                    "g4build manifest"}
    subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True,
                   env={**env, "G4BUILD_CLEAN": "1", "MAX_JOBS": "1"})
    again = log.read_text().splitlines()[-len(plan.steps):]
    assert again[0].startswith("g4build source fetch") and "[MAX_JOBS=1 " in again[0]
    assert not built.exists()  # the source step that ran again started from no tree (not a patched, built one)


def test_bash_script_stops_at_a_failing_step(tmp_path: Path, pin21: Pin) -> None:
    plan, log = _echo_plan(pin21, tmp_path)
    # the step's folder is created by the script (mkdir -p): keep it inside this test's folder
    broken = tmp_path / "broken-step"
    text = render_bash(plan).replace("step prefetch ", f"step prefetch_broken '' {broken} '' -- false; step x ", 1)
    script = tmp_path / "b.sh"
    script.write_text(text)
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert not any(" vllm " in c or c.startswith("py -m pip wheel") for c in log.read_text().splitlines())


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_bash_script_passes_shellcheck(tmp_path: Path, pin21: Pin) -> None:
    lay = default_layout(pin21, target("wsl"), base="/home/u/.cache/g4build")
    script = tmp_path / "b.sh"
    script.write_text(render(make_plan(pin21, [], target("wsl"), layout=lay, opts=Options(jobs=4))))
    proc = subprocess.run(["shellcheck", "-S", "warning", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_powershell_script_parses(pin21: Pin) -> None:
    ts = pytest.importorskip("tree_sitter")
    tsp = pytest.importorskip("tree_sitter_powershell")
    t = target("windows")
    plan = make_plan(pin21, [], t, layout=default_layout(pin21, t, base=""), opts=Options(jobs=6))
    text = render(plan)
    assert text == render_powershell(plan) and "\r\n" in text
    parser = ts.Parser(ts.Language(tsp.language()))
    tree = parser.parse(text.encode())
    assert not tree.root_node.has_error
    assert "vcvars64.bat" in text and "Invoke-Step 'vllm'" in text
    assert f"(Get-ChildItem -Path 'C:\\g4b\\wheels\\vllm-{plan.version}-*.whl').FullName" in text
    broken = parser.parse(text.replace("function Invoke-Step(", "function Invoke-Step((", 1).encode())
    assert broken.root_node.has_error  # the check can fail
