"""An installed g4build (a wheel, not this checkout) carries its data: pins, series, recipes, CI matrix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _checkout_copy(tmp_path: Path) -> Path:
    """The checkout's files as git sees them (tracked, and untracked but not ignored) in a folder of their own:
    pip builds in the source folder, so building from REPO would write build/ into it, and an old build/lib
    there would put stale modules into the wheel."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    dest = tmp_path / "checkout"
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.mark.network  # pip fetches the build backend (setuptools) into an isolated build environment
def test_wheel_ships_every_data_file_and_the_installed_cli_reads_them(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
         str(_checkout_copy(tmp_path))],
        check=True, capture_output=True, text=True,
    )
    (wheel,) = tmp_path.glob("g4build-*.whl")
    tracked = subprocess.run(["git", "ls-files", "patches", "recipes", "ci"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.split()
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path / "site")
    missing = [f for f in tracked if f"g4build/_data/{f}" not in names]
    assert tracked and missing == []
    # exactly the package's modules: none left out, none stale
    modules = {n for n in names if n.endswith(".py") and not n.startswith("g4build/_data/")}
    source = {p.relative_to(REPO / "toolkit").as_posix() for p in (REPO / "toolkit" / "g4build").rglob("*.py")}
    assert modules == source, (sorted(modules - source)[:10], sorted(source - modules)[:10])

    env = {k: v for k, v in os.environ.items() if k not in ("G4BUILD_HOME", "PYTHONPATH")}
    env["PYTHONPATH"] = str(tmp_path / "site")

    where = subprocess.run([sys.executable, "-c", "from g4build.data import project_root; print(project_root())"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where == str(tmp_path / "site" / "g4build" / "_data")  # the wheel's copy, not this checkout

    def g4(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "g4build", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "vllm-0.21.0" in {p["name"] for p in json.loads(g4("pins", "list", "--json"))}
    plan = json.loads(g4("wheel", "--arch", "sm120", "--os", "windows", "--dry-run", "--json"))
    # the Windows plan checks the interpreter first, then fetches the source (from the wheel's own pins)
    assert [step["name"] for step in plan["steps"]][:2] == ["python", "source"]
    recipes = json.loads(g4("recipe", "list", "--json"))
    assert "gemma4-26b-a4b-nvfp4-dflash" in {r["name"] for r in recipes}
    assert "sm120" in g4("ci", "matrix", "--json")
    # the build series (patches/deps/, one level deeper) are there too, and a Linux plan applies them
    assert "vllm-flash-attn" in {b["name"] for b in json.loads(g4("deps", "list", "--json"))["build_series"]}
    linux = json.loads(g4("wheel", "--arch", "sm120", "--os", "linux", "--dry-run", "--json"))
    assert "deps-vllm-flash-attn" in [step["name"] for step in linux["steps"]]
    # the measured build costs (patches/build-costs/) too: the plan starts the recorded long units first
    assert "build-order" in [step["name"] for step in linux["steps"]]
    # and the sm_120 unit accounting beside the vllm-kernel-archs series: the plan says what it finds
    assert any(n.startswith("sm120 units (patches/deps/vllm-kernel-archs/units-sm120.yaml)") for n in linux["notes"])


@pytest.mark.network  # as above: pip builds the wheel
def test_installed_cli_writes_into_the_project_it_stands_in_never_into_site_packages(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
                    str(_checkout_copy(tmp_path))],
                   check=True, capture_output=True, text=True)
    (wheel,) = tmp_path.glob("g4build-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    env = {k: v for k, v in os.environ.items() if k not in ("G4BUILD_HOME", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    installed = sorted(p.relative_to(site) for p in site.rglob("*"))

    def g4(*args: str, cwd: Path, home: str | None = None) -> subprocess.CompletedProcess[str]:
        full = env if home is None else {**env, "G4BUILD_HOME": home}
        return subprocess.run([sys.executable, "-m", "g4build", *args], cwd=cwd, env=full, capture_output=True,
                              text=True, check=False)

    # no project around: refused with what to do, nothing written anywhere
    outside = tmp_path / "outside"
    outside.mkdir()
    refused = g4("ci", "render", cwd=outside)
    assert refused.returncode == 2, refused.stderr
    assert "no g4build project to write into" in refused.stderr and "--root" in refused.stderr
    assert list(outside.iterdir()) == []
    # --check there has no workflows to compare: said so, not "stale"
    unchecked = g4("ci", "render", "--check", cwd=outside)
    said = " ".join(unchecked.stderr.split())
    assert unchecked.returncode == 2, unchecked.stderr
    assert "no g4build project to check" in said and "stale" not in said

    # --root or G4BUILD_HOME aimed at the installed data itself: refused naming what was passed and why
    data = site / "g4build" / "_data"
    for named, done in (
        (f"--root {data}", g4("--root", str(data), "ci", "render", cwd=outside)),
        (f"G4BUILD_HOME={data}", g4("ci", "render", cwd=outside, home=str(data))),
    ):
        said = " ".join(done.stderr.split())
        assert done.returncode == 2, done.stderr
        assert f"{named} is the data the installed g4build package carries" in said, said
        assert "no g4build project" not in said and "copy of that data" in said
    assert list(outside.iterdir()) == []

    # a checkout of the project's data: found from a subfolder, like git finds its repository
    project = tmp_path / "project"
    for folder in ("patches", "recipes", "ci"):
        shutil.copytree(REPO / folder, project / folder)
    (project / "sub").mkdir()
    done = g4("ci", "render", cwd=project / "sub")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (project / ".github" / "workflows").iterdir())
    # --root names it from anywhere (and `ci render --check` then finds the workflows just written)
    again = g4("--root", str(project), "ci", "render", "--check", cwd=outside)
    assert again.returncode == 0, again.stderr
    assert sorted(p.relative_to(site) for p in site.rglob("*")) == installed  # site-packages untouched
