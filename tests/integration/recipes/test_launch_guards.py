"""What a launch script checks before it installs anything: the local checkpoint folders (both shells) and, in
bash, the active venv; and `recipe render --wheel` given several wheels (a pattern that matched several)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.integration.recipes.conftest import REPO, Stubs, g4build, make_wheel
from tests.integration.recipes.test_readme_quickstart import overlaid
from tests.integration.recipes.test_recipe_powershell_ast import PsScript

from g4build.pins.model import load_pins
from g4build.recipes import load_recipe, recipe_names

RECIPE = "gemma4-26b-a4b-nvfp4-dflash"
WHEEL = "vllm-0.21.0+cu130.g4.abc-cp38-abi3-linux_x86_64.whl"


def render_with_wheel(tmp_path: Path, *extra: str, shell: str = "bash") -> Path:
    out = tmp_path / "out"
    name = WHEEL if shell == "bash" else WHEEL.replace("cp38-abi3-linux_x86_64", "cp312-cp312-win_amd64")
    wheel = overlaid(out, "vllm-0.21.0", name)  # its manifest names the series the recipe needs
    done = g4build("recipe", "render", RECIPE, "--shell", shell, "--out", str(out), "--wheel", str(wheel), *extra)
    assert done.returncode == 0, done.stderr
    return out / f"{RECIPE}{'.sh' if shell == 'bash' else '.ps1'}"


@pytest.mark.parametrize(("folder", "download", "key"), [
    ("gemma-4-26B-A4B-it-DFlash", "hf download z-lab/gemma-4-26B-A4B-it-DFlash --local-dir "
                                  "./models/gemma-4-26B-A4B-it-DFlash", "--set speculative.model=PATH"),
    ("gemma-4-26B-A4B-it-NVFP4", "hf download nvidia/Gemma-4-26B-A4B-NVFP4 --local-dir "
                                 "./models/gemma-4-26B-A4B-it-NVFP4", "--set model=PATH"),
])
def test_a_missing_model_folder_stops_before_pip(tmp_path: Path, stubs: Stubs, folder: str, download: str,
                                                 key: str) -> None:
    script = render_with_wheel(tmp_path)
    shutil.rmtree(stubs.dir.parent / "models" / folder)
    result = stubs.run(script)
    assert result.returncode == 1
    assert f"folder ./models/{folder} was not found" in result.stderr
    assert download in result.stderr and key in result.stderr
    assert stubs.programs() == ["nvidia-smi"]  # no python3: nothing installed, nothing checked


def test_an_absolute_model_folder_is_checked_and_a_hub_id_is_not(tmp_path: Path, stubs: Stubs) -> None:
    target = tmp_path / "my models" / "target"
    done = g4build("recipe", "render", "gemma4-26b-a4b-nvfp4-mtp", "--shell", "bash", "--out", str(tmp_path / "o"),
                   "--set", f"model={target}")
    assert done.returncode == 0, done.stderr
    script = tmp_path / "o" / "gemma4-26b-a4b-nvfp4-mtp.sh"
    missing = stubs.run(script)
    assert missing.returncode == 1 and f"target checkpoint folder {target} was not found." in missing.stderr
    assert f"--local-dir '{target}'" in missing.stderr  # a path with a space, quoted to paste
    target.mkdir(parents=True)
    assert stubs.run(script).returncode == 0  # the MTP drafter is a hub id (google/...): vLLM fetches it


def test_bash_stops_without_a_venv_before_pip(tmp_path: Path, stubs: Stubs) -> None:
    script = render_with_wheel(tmp_path)
    result = stubs.run(script, env={"VIRTUAL_ENV": ""})
    assert result.returncode == 1
    assert "no virtual environment is active, so pip would install the wheel into the system Python" in result.stderr
    assert "activate the venv" in result.stderr
    assert "python3" not in stubs.programs()


def test_bash_stops_when_python3_is_not_the_venvs(tmp_path: Path, stubs: Stubs) -> None:
    script = render_with_wheel(tmp_path)
    elsewhere = tmp_path / "other-venv"
    elsewhere.mkdir()
    result = stubs.run(script, env={"VIRTUAL_ENV": str(elsewhere)})
    assert result.returncode == 1
    assert f"python3 on PATH is not the active virtual environment's: {stubs.dir / 'python3'}" in result.stderr
    assert "python3" not in stubs.programs()


def test_bash_in_the_venv_installs(tmp_path: Path, stubs: Stubs) -> None:
    script = render_with_wheel(tmp_path)
    result = stubs.run(script)
    assert result.returncode == 0, result.stderr
    pip = [c["argv"] for c in stubs.calls() if c["prog"] == "python3" and c["argv"][0] == "-m"]
    assert pip == [["-m", "pip", "install", str(script.parent / WHEEL)]]


def test_a_script_without_a_wheel_needs_no_venv(tmp_path: Path, stubs: Stubs) -> None:
    done = g4build("recipe", "render", RECIPE, "--shell", "bash", "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    assert stubs.run(tmp_path / "o" / f"{RECIPE}.sh", env={"VIRTUAL_ENV": ""}).returncode == 0


def test_powershell_checks_the_folders_before_the_venv_and_pip(tmp_path: Path) -> None:
    pytest.importorskip("tree_sitter_powershell")
    script = render_with_wheel(tmp_path, "--set", "model=D:\\models\\gemma-4-26B-A4B-it-NVFP4", shell="pwsh")
    ps = PsScript(script.read_bytes())
    assert not ps.errors()
    text = script.read_text(encoding="utf-8-sig")
    target = text.index("Test-Path -LiteralPath 'D:\\models\\gemma-4-26B-A4B-it-NVFP4' -PathType Container")
    drafter = text.index("Test-Path -LiteralPath 'D:\\models\\gemma-4-26B-A4B-it-DFlash' -PathType Container")
    venv, pip = text.index("no virtual environment is active"), text.index("& $python -m pip install $wheel")
    assert target < drafter < venv < pip
    assert "hf download z-lab/gemma-4-26B-A4B-it-DFlash --local-dir D:\\models\\gemma-4-26B-A4B-it-DFlash" in text


def test_every_local_folder_of_a_shipped_recipe_names_its_download() -> None:
    pins = load_pins().pins
    for name in recipe_names():
        recipe = load_recipe(name)
        drafter = (recipe.speculative or {}).get("model", "")
        local = {key for key, path in (("model", recipe.model), ("speculative.model", drafter))
                 if str(path).startswith("./")}
        assert local == set(recipe.downloads), name
        assert set(recipe.pin_notes) <= set(pins), name  # a misspelt pin would never render its note


def test_several_wheels_are_refused_with_every_match_named(tmp_path: Path) -> None:
    older = make_wheel(tmp_path / "dist" / "vllm-0.33.0+g4.aaa-cp38-abi3-manylinux_2_28_x86_64.whl")
    newer = make_wheel(tmp_path / "dist" / "vllm-0.33.0+g4.bbb-cp38-abi3-manylinux_2_28_x86_64.whl")
    os.utime(older, (1_000_000, 1_000_000))
    for command in ("render", "check"):
        extra = ["--shell", "bash", "--out", str(tmp_path / "launch")] if command == "render" else []
        done = g4build("recipe", command, RECIPE, *extra, "--wheel", str(older), str(newer))
        assert done.returncode == 2, done.stderr
        assert f"--wheel takes one wheel, found 2 (a pattern that matched several?): {older}, {newer}" in done.stderr
        assert f"the newest: --wheel {newer}" in done.stderr
        assert "unexpected extra argument" not in done.stderr
    assert not (tmp_path / "launch").exists()
    stray = g4build("recipe", "render", RECIPE, "--shell", "bash", "stray")
    assert stray.returncode == 2 and "unexpected argument(s) stray" in stray.stderr


def test_the_readme_bash_block_picks_the_newest_wheel(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (render,) = [x for x in readme.splitlines() if x.startswith("g4build recipe render") and "--shell bash" in x]
    word = render.split("--wheel ", 1)[1].split(" --out", 1)[0]
    dist = tmp_path / "dist"
    first = make_wheel(dist / "vllm-0.33.0+g4.aaa-cp38-abi3-manylinux_2_28_x86_64.whl")
    second = make_wheel(dist / "vllm-0.33.0+g4.bbb-cp38-abi3-manylinux_2_28_x86_64.whl")
    os.utime(second, (1_000_000, 1_000_000))  # the second overlay's wheel name sorts later but is older here
    done = subprocess.run(["bash", "-c", f"printf '%s\\n' {word}"], cwd=tmp_path, capture_output=True, text=True,
                          check=True)
    assert done.stdout.splitlines() == [str(first.relative_to(tmp_path))]


@pytest.mark.parametrize(("pin", "has_note"), [("vllm-0.21.0", True), ("vllm-0.33.0", False)])
def test_a_pin_note_renders_for_its_pin_only(pin: str, has_note: bool) -> None:
    done = g4build("recipe", "render", RECIPE, "--shell", "bash", "--set", f"pin={pin}")
    assert done.returncode == 0, done.stderr
    assert ("On vllm-0.21.0 leave the MoE backend on auto" in done.stdout) is has_note
    assert "D:/" not in done.stdout and "D:\\" not in done.stdout  # no Windows path in a bash script
