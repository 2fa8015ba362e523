"""``--set args.*`` / ``speculative.*`` checked against the pinned vLLM's own sdist (read with ast, cached per pin),
through the real CLI with a cache of the test's own (the pinned sdist copied in, or absent for the offline case)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.integration.recipes.conftest import REPO

from g4build.pins.index import cache_root, fetch_verified
from g4build.pins.model import load_pins
from g4build.recipes import load_recipe, recipe_names

RECIPE = "gemma4-26b-a4b-nvfp4-dflash"  # pins vllm-0.21.0


@pytest.fixture(scope="module")
def pinned_sdist() -> Path:
    """The recipe's pinned sdist, sha256-checked, from the shared download cache (fetched once)."""
    pin = load_pins().get(load_recipe(RECIPE).pin)
    return fetch_verified("vllm", pin.sdist.file, pin.sdist.sha256, cache_dir=cache_root() / "sdists").path


def _cache_with(sdist: Path, cache: Path) -> Path:
    (cache / "sdists").mkdir(parents=True)
    shutil.copyfile(sdist, cache / "sdists" / sdist.name)
    return cache


@pytest.fixture
def cache_with_sdist(tmp_path: Path, pinned_sdist: Path) -> Path:
    return _cache_with(pinned_sdist, tmp_path / "cache")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory, pinned_sdist: Path) -> Path:
    """One cache for the read-only checks (the table is built once, by the first of them)."""
    return _cache_with(pinned_sdist, tmp_path_factory.mktemp("cache"))


def run(cache: Path, *args: str, home: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(home), "G4BUILD_CACHE": str(cache),
           "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "g4build", *args], capture_output=True, text=True,
                          encoding="utf-8", env=env, cwd=REPO, check=False)


@pytest.mark.network
@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("speculative.modle=/d", "did you mean 'model'"),
        ("args.max-model-lenn=1", "did you mean 'max-model-len'"),
        ("args.no-tool-call-parser=x", "did you mean 'tool-call-parser'"),  # no- only for a boolean
        ("args.max-model-len=-5", "at least -1"),  # vLLM's own Field(ge=-1): -1 is "auto"
        ("args.max-num-seqs=0", "at least 1"),  # no declared bound: the name says a count
        ("args.max-num-seqs=2k", "expected an integer"),  # a plain int option, no k suffix there
        ("speculative.num_speculative_tokens=0", "greater than 0"),
    ],
)
def test_unknown_names_and_bad_values_exit_2(shared_cache: Path, item: str, needle: str) -> None:
    done = run(shared_cache, "recipe", "show", RECIPE, "--set", item)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr and "vLLM 0.21.0" in done.stderr
    assert done.stdout == ""


@pytest.mark.network
def test_valid_sets_pass_and_the_table_is_cached_per_pin(tmp_path: Path, cache_with_sdist: Path) -> None:
    good = ["args.max-model-len=128k", "args.max-model-len=-1", "args.no-enable-prefix-caching=true",
            "args.headless=true", "speculative.num_speculative_tokens=8", "speculative.attention_backend=flash_attn"]
    sets = [w for item in good for w in ("--set", item)]
    done = run(cache_with_sdist, "recipe", "check", RECIPE, *sets, "--json")
    assert json.loads(done.stdout)["sets"] == {"checked": True, "vllm": "0.21.0", "note": None}, done.stderr
    assert "not checked" not in done.stderr
    # a project that records no table (a pin added by hand) builds it from the cached sdist and caches it
    project = tmp_path / "project"
    for folder in ("patches", "recipes", "ci"):
        shutil.copytree(REPO / folder, project / folder)
    shutil.rmtree(project / "recipes" / "vllm-args")
    done = run(cache_with_sdist, "recipe", "check", RECIPE, *sets, "--json", home=project)
    assert json.loads(done.stdout)["sets"] == {"checked": True, "vllm": "0.21.0", "note": None}, done.stderr
    # the table outlives the sdist: a later run checks without it
    assert len(list((cache_with_sdist / "vllm-args").glob("vllm-0.21.0-*.json"))) == 1
    (cache_with_sdist / "sdists" / "vllm-0.21.0.tar.gz").unlink()
    again = run(cache_with_sdist, "recipe", "show", RECIPE, "--set", "speculative.modle=/d", home=project)
    assert again.returncode == 2 and "did you mean 'model'" in again.stderr


@pytest.mark.network
def test_every_shipped_recipe_option_is_a_real_vllm_option(shared_cache: Path) -> None:
    # the recipes' own options, fed back as --set, pass the check: the table knows engine and server options
    for name in recipe_names():
        r = load_recipe(name)
        sets = [w for key, value in r.args.items() for w in ("--set", f"args.{key}={json.dumps(value)}")]
        sets += [w for key in (r.speculative or {}) for w in ("--set", f"speculative.{key}={r.speculative[key]}")]
        done = run(shared_cache, "recipe", "show", name, *sets, "--json")
        assert done.returncode == 0, (name, done.stderr)


def test_offline_every_pin_checks_its_names_from_the_recorded_table(tmp_path: Path) -> None:
    # no sdist, no cache: the table recorded in the project (recipes/vllm-args/) still catches a typo, for each pin
    for pin in load_pins().pins.values():
        done = run(tmp_path / "empty-cache", "recipe", "show", RECIPE, "--set", f"pin={pin.name}",
                   "--set", "args.max-modle-len=3")
        assert done.returncode == 2, (pin.name, done.stderr)
        assert f"vLLM {pin.version}" in done.stderr and "did you mean 'max-model-len'" in done.stderr
    assert not (tmp_path / "empty-cache" / "sdists").exists()  # nothing downloaded


def test_a_pin_without_a_table_or_source_reports_the_sets_unchecked(tmp_path: Path) -> None:
    project = tmp_path / "project"  # the project's data without the recorded tables (a pin added by hand)
    for folder in ("patches", "recipes", "ci"):
        shutil.copytree(REPO / folder, project / folder)
    shutil.rmtree(project / "recipes" / "vllm-args")
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(project),
           "G4BUILD_CACHE": str(tmp_path / "empty-cache"), "COLUMNS": "300"}
    done = subprocess.run([sys.executable, "-m", "g4build", "recipe", "check", RECIPE, "--set",
                           "speculative.modle=/d", "--json"], capture_output=True, text=True, encoding="utf-8",
                          env=env, cwd=tmp_path, check=False)
    assert json.loads(done.stdout)["sets"]["checked"] is False
    assert "--set names not checked against vLLM 0.21.0" in done.stderr
    assert "recipes/vllm-args/vllm-0.21.0.json" in done.stderr and "g4build pins add" in done.stderr
    assert "g4build source fetch --pin vllm-0.21.0" in done.stderr
    assert not (tmp_path / "empty-cache" / "sdists").exists()  # nothing downloaded
