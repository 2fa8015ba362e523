"""Launch scripts are right for every pin without its sdist (fourth review, 1): each pin's envs.py names are recorded
beside its argument table (recipes/vllm-args/<pin>.envs.json), so a script rendered with an empty cache exports only
what the pin reads and gets the pin's --moe-backend / --linear-backend, exactly as one rendered from the sdist."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.integration.recipes.conftest import REPO

from g4build.pins.index import cache_root, fetch_verified
from g4build.pins.model import load_pins
from g4build.recipes import recipe_names
from g4build.recipes.vllm_envs import envs_from_sdist, recorded_envs, recorded_envs_path

PINS = sorted(load_pins().pins)
EXPORT = re.compile(r"^\s*export (VLLM_\w+)=", re.MULTILINE)


def _render(recipe: str, pin: str, cache: Path, home: Path = REPO) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(home), "G4BUILD_CACHE": str(cache),
           "COLUMNS": "300"}
    done = subprocess.run([sys.executable, "-m", "g4build", "recipe", "render", recipe, "--shell", "bash",
                           "--set", f"pin={pin}"], capture_output=True, text=True, encoding="utf-8", env=env,
                          cwd=REPO, check=False)
    assert done.returncode == 0, (recipe, pin, done.stderr)
    return done.stdout


@pytest.mark.parametrize("name", PINS)
def test_every_pin_records_the_environment_variables_it_reads(name: str) -> None:
    pin = load_pins().get(name)
    path = recorded_envs_path(pin)
    assert path.is_file(), f"{path} is missing: `g4build pins add` writes it (or vllm_envs.record_envs)"
    envs = recorded_envs(pin)
    assert envs is not None and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in envs, name
    dropped = {"VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_NVFP4_GEMM_BACKEND"}
    assert (dropped <= envs) is (name == "vllm-0.21.0"), name


@pytest.mark.parametrize("pin", PINS)
def test_an_empty_cache_renders_only_what_the_pin_reads(tmp_path: Path, pin: str) -> None:
    envs = recorded_envs(load_pins().get(pin))
    assert envs is not None
    for recipe in recipe_names():
        script = _render(recipe, pin, tmp_path / "empty")
        exported = set(EXPORT.findall(script))
        assert exported and exported <= envs, (recipe, pin, exported - envs)
        if pin != "vllm-0.21.0" and "VLLM_NVFP4_GEMM_BACKEND=" in script:  # a recipe choosing 0.21.0's GEMM
            assert "'--linear-backend'" in script, (recipe, pin)
        if pin != "vllm-0.21.0" and "VLLM_USE_FLASHINFER_MOE_FP4=" in script:
            assert "'--moe-backend'" in script, (recipe, pin)
    assert not list((tmp_path / "empty").glob("**/*.tar.gz"))  # nothing was downloaded


@pytest.mark.network  # the pinned sdists (34-47 MB each), fetched once into the shared cache
@pytest.mark.parametrize("name", PINS)
def test_the_recorded_names_are_the_sdists_envs_py(name: str) -> None:
    pin = load_pins().get(name)
    sdist = fetch_verified("vllm", pin.sdist.file, pin.sdist.sha256, cache_dir=cache_root() / "sdists").path
    assert json.loads(recorded_envs_path(pin).read_text(encoding="utf-8")) == envs_from_sdist(pin, sdist), (
        f"regenerate with vllm_envs.record_envs for {name} and review the diff")


@pytest.mark.network
@pytest.mark.parametrize("pin", PINS)
def test_rendering_with_an_empty_cache_equals_rendering_from_the_sdist(tmp_path: Path, pin: str) -> None:
    """The offline render (recorded data, empty cache) against one from the sdist alone: a project copy that records
    neither the pin's names nor its argument table, with the sdist in its cache."""
    p = load_pins().get(pin)
    sdist = fetch_verified("vllm", p.sdist.file, p.sdist.sha256, cache_dir=cache_root() / "sdists").path
    bare = tmp_path / "project"
    for folder in ("patches", "recipes", "ci"):
        shutil.copytree(REPO / folder, bare / folder)
    for recorded in (bare / "recipes" / "vllm-args").glob(f"{pin}*.json"):
        recorded.unlink()
    cached = tmp_path / "cache"
    (cached / "sdists").mkdir(parents=True)
    shutil.copyfile(sdist, cached / "sdists" / sdist.name)
    for recipe in recipe_names():
        assert _render(recipe, pin, tmp_path / "empty") == _render(recipe, pin, cached, home=bare), (recipe, pin)
