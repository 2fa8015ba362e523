"""Paths typed relative at render time reach the script so that it works from any working directory, and a
recipe file copied elsewhere is valid there (or says what to rename)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.integration.recipes.conftest import REPO, Stubs, g4build, make_wheel

RECIPE = "gemma4-26b-a4b-nvfp4-baseline"
WHEEL = "vllm-0.21.0+cu130.g4.abc-cp38-abi3-linux_x86_64.whl"
WIN_WHEEL = "vllm-0.21.0+cu130.g4.abc-cp312-cp312-win_amd64.whl"  # what a PowerShell script may install


def run_from(stubs: Stubs, script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The script started from ``cwd`` (not its own folder), with the recording stubs first on PATH and their
    folder standing for the active venv (the stub python3 is inside it)."""
    env = {"PATH": f"{stubs.dir}:/usr/bin:/bin", "G4_STUB_RECORD": str(stubs.record), "HOME": str(stubs.dir),
           "LANG": "C.UTF-8", "VIRTUAL_ENV": str(stubs.dir.parent)}
    return subprocess.run(["/bin/bash", str(script)], capture_output=True, text=True, encoding="utf-8", env=env,
                          cwd=cwd, check=False)


@pytest.mark.parametrize("shell", ["bash", "powershell"])
def test_relative_wheel_and_model_are_written_absolute(tmp_path: Path, shell: str) -> None:
    work = tmp_path / "work"
    name = WHEEL if shell == "bash" else WIN_WHEEL
    make_wheel(work / "dist" / name)
    (work / "models" / "target").mkdir(parents=True)
    done = g4build("recipe", "render", RECIPE, "--shell", shell, "--wheel", f"dist/{name}",
                   "--set", "model=./models/target", "--set", "speculative=null", cwd=work)
    assert done.returncode == 0, done.stderr
    assert f"'{work / 'dist' / name}'" in done.stdout
    assert f"'{work / 'models' / 'target'}'" in done.stdout
    assert f"'dist/{name}'" not in done.stdout and "'./models/target'" not in done.stdout
    # a Hugging Face id is no local path: it stays as typed
    hub = g4build("recipe", "render", RECIPE, "--shell", shell, "--set", "model=google/gemma-4-26b", cwd=work)
    assert hub.returncode == 0, hub.stderr
    assert "'google/gemma-4-26b'" in hub.stdout and str(work) not in hub.stdout


def test_the_bash_script_installs_and_serves_the_same_files_from_elsewhere(tmp_path: Path, stubs: Stubs) -> None:
    work = tmp_path / "work"
    wheel = make_wheel(work / "dist" / WHEEL)
    (work / "models" / "target").mkdir(parents=True)
    scripts = tmp_path / "home" / "scripts"  # not beside the wheel's folder: the wheel by its absolute path
    done = g4build("recipe", "render", RECIPE, "--shell", "bash", "--out", str(scripts),
                   "--wheel", f"dist/{WHEEL}", "--set", "model=./models/target", cwd=work)
    assert done.returncode == 0, done.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_from(stubs, scripts / f"{RECIPE}.sh", elsewhere)
    assert result.returncode == 0, result.stderr
    calls = {c["prog"]: c["argv"] for c in stubs.calls() if c["argv"][:1] != ["-c"]}  # not the FlashInfer check
    assert calls["python3"] == ["-m", "pip", "install", str(wheel)]
    assert calls["vllm"][:2] == ["serve", str(work / "models" / "target")]


def test_a_wheel_beside_the_out_folder_moves_with_it(tmp_path: Path, stubs: Stubs) -> None:
    # CI's layout: launch/ and wheelhouse/ side by side, published together; no runner path in the script
    work = tmp_path / "work"
    make_wheel(work / "wheelhouse" / WHEEL)
    done = g4build("recipe", "render", RECIPE, "--shell", "bash", "--out", "launch", "--wheel", f"wheelhouse/{WHEEL}",
                   cwd=work)
    assert done.returncode == 0, done.stderr
    script = (work / "launch" / f"{RECIPE}.sh").read_text(encoding="utf-8")
    assert str(work) not in script and "relative to this script's folder" in script
    moved = tmp_path / "unpacked artifact"
    shutil.move(work, moved)
    result = run_from(stubs, moved / "launch" / f"{RECIPE}.sh", tmp_path)
    assert result.returncode == 0, result.stderr
    [pip] = [c["argv"] for c in stubs.calls() if c["prog"] == "python3" and c["argv"][0] == "-m"]
    assert os.path.realpath(pip[-1]) == str(moved / "wheelhouse" / WHEEL)


def test_a_copied_recipe_is_valid_under_its_name_and_a_renamed_one_says_what_to_do(tmp_path: Path) -> None:
    source = REPO / "recipes" / f"{RECIPE}.yaml"
    shutil.copyfile(source, tmp_path / f"{RECIPE}.yaml")
    same = g4build("recipe", "check", str(tmp_path / f"{RECIPE}.yaml"), cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    shutil.copyfile(source, tmp_path / "mine.yaml")
    renamed = g4build("recipe", "check", "mine.yaml", cwd=tmp_path)
    assert renamed.returncode == 3
    assert "expected 'mine' (the file's name)" in renamed.stderr
    assert f"rename the file to {RECIPE}.yaml, or set `name: mine` in mine.yaml" in renamed.stderr
