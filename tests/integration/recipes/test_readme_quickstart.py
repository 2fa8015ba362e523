"""README's quickstart, run as written: its `recipe render` lines (bash through bash itself, PowerShell's with
the same words) against an overlaid wheel of the pin they name, then the bash launch script with recording stubs
for vllm, nvidia-smi and python3: the target and the drafter it serves are the folders the quickstart downloads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.integration.recipes.conftest import REPO, Stubs, make_wheel
from tests.integration.recipes.test_recipe_powershell_ast import PsScript

from g4build.emit.manifest import make_manifest
from g4build.pins.index import cache_root
from g4build.pins.model import load_pins
from g4build.series.model import load_all

README = (REPO / "README.md").read_text(encoding="utf-8")
QUICK = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]


def block(language: str) -> str:
    (found,) = re.findall(rf"```{language}\n(.*?)```", QUICK, re.S)
    return str(found)


def line(language: str, needle: str) -> str:
    (found,) = [x for x in block(language).splitlines() if needle in x]
    return str(found)


def overlaid(folder: Path, pin_name: str, name: str) -> Path:
    """A wheel as `g4build overlay --pin PIN` names and stamps it: its manifest carries the pin's series."""
    pin = load_pins().get(pin_name)
    series = [s for s in load_all() if s.variant(pin.name) is not None]
    return make_wheel(folder / name, make_manifest(pin, series, route="overlay"))


def g4_env(home: Path) -> dict[str, str]:
    shim = home / "bin"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "g4build").write_text(f"#!/bin/sh\nexec {sys.executable} -m g4build \"$@\"\n", encoding="utf-8")
    (shim / "g4build").chmod(0o755)
    return {**os.environ, "HOME": str(home), "PATH": f"{shim}:{os.environ['PATH']}",
            "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(REPO), "G4BUILD_CACHE": str(home / "cache")}


def test_the_bash_quickstart_renders_and_serves_as_written(tmp_path: Path, stubs: Stubs) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    render = line("bash", "g4build recipe render")
    pin = re.search(r"--set pin=(\S+)", render)
    assert pin is not None
    version = pin.group(1).removeprefix("vllm-")
    overlaid(work / "dist", pin.group(1), f"vllm-{version}+g4.0123456789-cp38-abi3-manylinux_2_28_x86_64.whl")
    done = subprocess.run(["bash", "-c", render], cwd=work, env=g4_env(home), capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    script = work / line("bash", "./launch/").strip()
    assert script.is_file() and os.access(script, os.X_OK)
    result = stubs.run(script)
    assert result.returncode == 0, result.stderr
    (vllm,) = [c for c in stubs.calls() if c["prog"] == "vllm"]
    target = line("bash", "hf download").split("--local-dir ")[1].strip().replace("~", str(home))
    assert vllm["argv"][:2] == ["serve", target]
    spec = json.loads(vllm["argv"][vllm["argv"].index("--speculative-config") + 1])
    assert spec["model"] == str(Path(target).parent / "gemma4-dflash-0.2b")  # beside the target, as README says
    pip = [c["argv"] for c in stubs.calls() if c["prog"] == "python3" and c["argv"][:1] == ["-m"]]
    (installed,) = pip
    assert installed[:3] == ["-m", "pip", "install"]  # the wheel beside the script's folder (they move together)
    assert Path(installed[3]).resolve() == (work / "dist" / f"vllm-{version}+g4.0123456789-cp38-abi3-"
                                            "manylinux_2_28_x86_64.whl").resolve()


def test_the_powershell_quickstart_renders_a_script_that_parses(tmp_path: Path) -> None:
    pytest.importorskip("tree_sitter_powershell")
    render = line("powershell", "g4build recipe render")
    pin = re.search(r"--set pin=(\S+)", render)
    assert pin is not None
    wheel = overlaid(tmp_path / "wheels", pin.group(1), "vllm-0.26.0+cu132.g4.0123456789-cp312-cp312-win_amd64.whl")
    out = tmp_path / "launch"
    words = render.split()[1:]  # PowerShell passes these words as they are: none is quoted
    words[words.index("$wheel")] = str(wheel)
    words[words.index("--out") + 1] = str(out)
    done = subprocess.run([sys.executable, "-m", "g4build", *words], env=g4_env(tmp_path / "home"),
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ps = PsScript((out / "gemma4-26b-a4b-nvfp4-dflash.ps1").read_bytes())
    assert not ps.root.has_error
    argv = ps.array("$vllmArgs")
    target = render.split("--set model=")[1].split()[0]
    assert argv[:2] == ["serve", target]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["model"] == target.rsplit("\\", 1)[0] + "\\gemma4-dflash-0.2b"


@pytest.mark.network
@pytest.mark.heavy  # the registry wheel of the pin the quickstart names (~300 MB), fetched once into the cache
def test_the_bash_quickstart_overlay_render_and_launch_run_as_written(tmp_path: Path, stubs: Stubs) -> None:
    """Every g4build line of the bash quickstart, as README writes it (only pip's and hf's downloads left out):
    overlay, render, then the launch script, with stubs for what needs a GPU."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    env = {**g4_env(home), "G4BUILD_CACHE": str(cache_root())}  # the shared download cache, not the tmp HOME's
    lines = [x for x in block("bash").splitlines() if x.startswith(("g4build overlay", "g4build recipe render"))]
    assert [x.split()[1] for x in lines] == ["overlay", "recipe"]
    for command in lines:
        done = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (command, done.stderr)
    script = work / line("bash", "./launch/").strip()
    result = stubs.run(script)
    assert result.returncode == 0, result.stderr
    (vllm,) = [c for c in stubs.calls() if c["prog"] == "vllm"]
    assert vllm["argv"][0] == "serve" and vllm["argv"][1].startswith(str(home))
