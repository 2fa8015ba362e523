"""What `recipe render --wheel` / `recipe check --wheel` read from a wheel, and the per-pin data the env rules
trust. The wheel's own ``<name>-<version>.dist-info/build-manifest.json`` (the folder its file name names) is the
only manifest read: a decoy in a nested folder, or in a vendored package's dist-info, would pick another pin's
torch and arguments. A manifest that claims series but names no known pin is refused, as validate refuses it.
The recorded and cached lists of a pin's environment variables are a list of names or a clear error (exit 3),
never a string read letter by letter. Real zip wheels and JSON files in tmp_path, the real command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from g4build.emit.manifest import make_manifest
from g4build.pins.model import load_pins
from g4build.series.model import load_all

REPO = Path(__file__).resolve().parents[3]
RECIPE = "gemma4-26b-a4b-nvfp4-dflash"
WHEEL = "vllm-0.33.0+g4.0123456789-cp38-abi3-manylinux_2_28_x86_64.whl"
OWN = "vllm-0.33.0+g4.0123456789.dist-info"


def g4(*args: str, home: Path = REPO, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(home), "COLUMNS": "300"}
    if cache is not None:
        env["G4BUILD_CACHE"] = str(cache)
    return subprocess.run([sys.executable, "-m", "g4build", *args], capture_output=True, text=True,
                          encoding="utf-8", env=env, cwd=REPO, timeout=300, check=False)


def _manifest(pin_name: str) -> dict[str, Any]:
    pin = load_pins().get(pin_name)
    return make_manifest(pin, [s for s in load_all() if s.variant(pin.name)], route="overlay")


def _wheel(folder: Path, members: list[tuple[str, str]]) -> Path:
    """A zip wheel holding ``members`` in this order (the first one is what a first-match reader takes)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / WHEEL
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
        for name, text in members:
            archive.writestr(name, text)
    return path


@pytest.mark.parametrize("decoy", [
    "vllm/third_party/vllm-0.29.0.dist-info/build-manifest.json",  # nested, at any depth
    "flashinfer_python-0.6.8.dist-info/build-manifest.json",  # a vendored package's, at the top
    "vllm-0.29.0.dist-info/build-manifest.json",  # the project's name, another version than the file's
])
def test_only_the_wheels_own_dist_info_manifest_is_read(tmp_path: Path, decoy: str) -> None:
    wheel = _wheel(tmp_path / "dist", [(decoy, json.dumps(_manifest("vllm-0.29.0"))),
                                       (f"{OWN}/build-manifest.json", json.dumps(_manifest("vllm-0.33.0")))])
    out = tmp_path / "launch"
    done = g4("recipe", "render", RECIPE, "--shell", "bash", "--wheel", str(wheel), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "pin vllm-0.33.0 follows the wheel's build-manifest.json" in done.stderr, done.stderr
    torch_033, torch_029 = load_pins().get("vllm-0.33.0").torch, load_pins().get("vllm-0.29.0").torch
    assert torch_033 != torch_029
    script = (out / f"{RECIPE}.sh").read_text(encoding="utf-8")
    assert f"torch=={torch_033}" in script and f"torch=={torch_029}" not in script


def test_a_decoy_alone_is_no_manifest(tmp_path: Path) -> None:
    """Without its own manifest the wheel claims nothing: the pin does not follow the decoy."""
    wheel = _wheel(tmp_path / "dist", [("vllm/x/vllm-0.29.0.dist-info/build-manifest.json",
                                        json.dumps(_manifest("vllm-0.29.0")))])
    done = g4("recipe", "check", RECIPE, "--wheel", str(wheel), "--json")
    assert "follows the wheel" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert report["sets"]["vllm"] == "0.21.0", report  # the recipe's own pin, not the decoy's 0.29.0


def test_two_folders_that_are_both_the_wheels_own_are_refused(tmp_path: Path) -> None:
    manifest = json.dumps(_manifest("vllm-0.33.0"))
    wheel = _wheel(tmp_path / "dist", [(f"{OWN}/build-manifest.json", manifest),
                                       ("VLLM-0.33.0+g4.123456789.dist-info/build-manifest.json", manifest)])
    done = g4("recipe", "check", RECIPE, "--wheel", str(wheel))
    assert done.returncode == 2 and "expected one vllm-0.33.0+g4.123456789.dist-info folder" in done.stderr, \
        done.stderr
    assert "found 2" in done.stderr


@pytest.mark.parametrize("pin", [None, {"name": "vllm-9.9.9"}])
def test_series_claimed_by_a_manifest_without_a_known_pin_are_refused(tmp_path: Path, pin: Any) -> None:
    manifest = _manifest("vllm-0.33.0")
    assert manifest["series"], "the pin has series to claim"
    if pin is None:
        del manifest["pin"]
    else:
        manifest["pin"] = pin
    wheel = _wheel(tmp_path / "dist", [(f"{OWN}/build-manifest.json", json.dumps(manifest))])
    done = g4("recipe", "check", RECIPE, "--set", "pin=vllm-0.33.0", "--wheel", str(wheel), "--json")
    assert done.returncode == 11, (done.stdout, done.stderr)
    which = "no pin" if pin is None else "an unknown pin 'vllm-9.9.9'"
    said = [f for f in json.loads(done.stdout)["findings"] if f"build-manifest.json names {which}" in f["message"]]
    assert said and said[0]["severity"] == "error" and said[0]["rule"] == "pin", done.stdout
    validated = g4("validate", str(wheel), "--json")  # validate refuses the same claim
    assert validated.returncode != 0


# --- the per-pin list of vLLM's environment variables --------------------------------------------------------


def _project(tmp_path: Path) -> Path:
    top = tmp_path / "project"
    shutil.copytree(REPO / "patches", top / "patches")
    shutil.copytree(REPO / "recipes", top / "recipes")
    return top


@pytest.mark.parametrize(("envs", "found"), [("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "found str"),
                                             (["VLLM_ALLOW_LONG_MAX_MODEL_LEN", 7], "found 7"),
                                             ({"VLLM_X": 1}, "found dict"), (None, "found NoneType")])
def test_a_recorded_list_of_the_wrong_type_is_a_config_error(tmp_path: Path, envs: Any, found: str) -> None:
    top = _project(tmp_path)
    path = top / "recipes" / "vllm-args" / "vllm-0.21.0.envs.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["envs"] = envs
    path.write_text(json.dumps(data), encoding="utf-8")
    done = g4("recipe", "check", "gemma4-26b-a4b-nvfp4-baseline", home=top, cache=tmp_path / "cache")
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert f"vllm-0.21.0.envs.json: 'envs' must be a list of environment variable names, {found}" in done.stderr
    assert "unexpected" not in done.stderr


@pytest.mark.parametrize(("envs", "found"), [("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "found str"),
                                             (["VLLM_USE_FLASHINFER_SAMPLER", 1], "found 1")])
def test_a_cached_list_of_the_wrong_type_is_a_config_error(tmp_path: Path, envs: Any, found: str) -> None:
    """A pin without a recorded list reads the user cache: typed the same way (a string there once dropped the
    recipe's VLLM_ variables as unread)."""
    top = _project(tmp_path)
    recorded = top / "recipes" / "vllm-args" / "vllm-0.21.0.envs.json"
    names = json.loads(recorded.read_text(encoding="utf-8"))["envs"]
    recorded.unlink()
    pin = load_pins().get("vllm-0.21.0")
    cache = tmp_path / "cache"
    cached = cache / "vllm-envs" / f"{pin.name}-{pin.sdist.sha256[:16]}.json"
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps({"version": 1, "envs": envs}), encoding="utf-8")
    done = g4("recipe", "check", "gemma4-26b-a4b-nvfp4-baseline", home=top, cache=cache)
    assert done.returncode == 3 and f"'envs' must be a list of environment variable names, {found}" in done.stderr, \
        (done.stdout, done.stderr)
    cached.write_text(json.dumps({"version": 1, "envs": names}), encoding="utf-8")  # the same names, well typed
    good = g4("recipe", "check", "gemma4-26b-a4b-nvfp4-baseline", "--json", home=top, cache=cache)
    assert good.returncode == 0, (good.stdout, good.stderr)
    assert not [f for f in json.loads(good.stdout)["findings"] if f["rule"] == "env-names"], good.stdout
