"""`g4build overlay --venv`: an installed vLLM patched in place, RECORD kept true, undone exactly;
and `g4build overlay --pin` alone, which fetches the pin's registry wheel (from a real index on loopback)."""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.support.index_server import serve_index
from tests.support.wheelsfactory import (
    PRISTINE,
    SeriesSpec,
    build_wheel,
    git_patch,
    make_project,
    record_hash,
    run_g4build,
)
from tests.support.yamltext import yaml_text

from g4build.data import patches_dir
from g4build.errors import ValidationError


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-venv lock files live in the cache: keep them inside the test's folder."""
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))


def _venv_with_wheel(tmp_path: Path, wheel: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True)
    return venv


def _snapshot(venv: Path) -> dict[str, str]:
    return {str(p.relative_to(venv)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in venv.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def _record_ok(site: Path) -> None:
    (dist,) = site.glob("vllm-*.dist-info")
    for path, digest, size in csv.reader((dist / "RECORD").read_text().splitlines()):
        if digest:
            data = (site / path).read_bytes()
            assert (record_hash(data), str(len(data))) == (digest, size), path


@pytest.mark.skipif(sys.platform == "win32", reason="venv layout of Linux")
def test_venv_overlay_then_undo_restores_exactly(tmp_path: Path, project: Path) -> None:
    venv = _venv_with_wheel(tmp_path, build_wheel(tmp_path / "in"))
    before = _snapshot(venv)
    (site,) = venv.glob("lib/python3*/site-packages")
    done = run_g4build("overlay", "--venv", str(venv), "--pin", "vllm-0.21.0", "--json")
    assert done.returncode == 0, done.stderr
    assert "vllm/spec/dflash.py" in json.loads(done.stdout)["files"]
    assert "G4 fix: step 7" in (site / "vllm/spec/dflash.py").read_text()
    assert (site / "vllm/spec/added.py").is_file() and not (site / "vllm/obsolete.py").exists()
    _record_ok(site)
    check = subprocess.run([str(venv / "bin/python"), "-c", "import vllm.spec.dflash as d; print(d.step_7(0))"],
                           capture_output=True, text=True, check=True)
    assert check.stdout.strip() == "7"

    again = run_g4build("overlay", "--venv", str(venv), "--pin", "vllm-0.21.0")
    assert again.returncode == 2 and "already carries a g4build overlay" in again.stderr

    undone = run_g4build("overlay", "--venv", str(venv), "--undo")
    assert undone.returncode == 0, undone.stderr
    assert _snapshot(venv) == before
    _record_ok(site)
    nothing = run_g4build("overlay", "--venv", str(venv), "--undo")
    assert nothing.returncode == 2 and "no g4build overlay to undo" in nothing.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="venv layout of Linux")
def test_venv_of_a_forks_wheel_is_merged_three_ways_then_undone(tmp_path: Path, project: Path) -> None:
    from g4build.overlay.venv import overlay_venv, undo_venv
    from g4build.overlay.wheel import plan_overlay
    from g4build.pins.model import load_pins
    from g4build.series.model import load_all

    rel = "vllm/spec/dflash.py"
    fork = PRISTINE[rel].replace("def step_8(x):\n", "def step_8(x):  # fork: Windows\n")  # in the hunk's context
    venv = _venv_with_wheel(tmp_path, build_wheel(tmp_path / "in", {**PRISTINE, rel: fork}))
    before = _snapshot(venv)
    (site,) = venv.glob("lib/python3*/site-packages")
    plan = plan_overlay(load_pins().get("vllm-0.21.0"), load_all(),
                        pristine=lambda paths: {p: PRISTINE[p].encode() for p in paths if p in PRISTINE})
    done = overlay_venv(venv, plan)
    assert rel in done.files
    text = (site / rel).read_text()
    assert "def step_8(x):  # fork: Windows\n" in text and "G4 fix: step 7" in text
    _record_ok(site)
    undo_venv(venv, force=False)
    assert _snapshot(venv) == before


def _tree(venv: Path) -> list[str]:
    """Every file and folder under the venv (bytecode caches left out)."""
    return sorted(str(p.relative_to(venv)) for p in venv.rglob("*") if "__pycache__" not in p.parts)


@pytest.mark.skipif(sys.platform == "win32", reason="venv layout of Linux")
def test_venv_undo_removes_the_folders_the_overlay_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    patch = git_patch(PRISTINE, {"vllm/fresh/deep/new.py": "NEW = 1\n"}, tmp_path / "g")
    root = make_project(tmp_path / "p", [SeriesSpec(name="fresh", patches=[patch])])
    monkeypatch.setenv("G4BUILD_HOME", str(root))
    venv = _venv_with_wheel(tmp_path, build_wheel(tmp_path / "in"))
    before, files_before = _tree(venv), _snapshot(venv)
    (site,) = venv.glob("lib/python3*/site-packages")
    done = run_g4build("overlay", "--venv", str(venv), "--pin", "vllm-0.21.0")
    assert done.returncode == 0, done.stderr
    subprocess.run([str(venv / "bin/python"), "-c", "import compileall, vllm.fresh.deep.new as m; "
                    "compileall.compile_file(m.__file__, quiet=1)"], check=True)  # leaves bytecode
    assert (site / "vllm/fresh/deep/__pycache__").is_dir()
    undone = run_g4build("overlay", "--venv", str(venv), "--undo")
    assert undone.returncode == 0, undone.stderr
    assert not (site / "vllm/fresh").exists()
    assert (_tree(venv), _snapshot(venv)) == (before, files_before)


@pytest.mark.skipif(sys.platform == "win32", reason="venv layout of Linux")
def test_undo_works_on_a_moved_venv_and_writes_only_inside_it(tmp_path: Path, project: Path) -> None:
    venv = _venv_with_wheel(tmp_path, build_wheel(tmp_path / "in"))
    before = _snapshot(venv)
    done = run_g4build("overlay", "--venv", str(venv), "--pin", "vllm-0.21.0")
    assert done.returncode == 0, done.stderr
    moved = venv.rename(tmp_path / "moved")
    undone = run_g4build("overlay", "--venv", str(moved), "--undo")
    assert undone.returncode == 0, undone.stderr
    assert _snapshot(moved) == before and not venv.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="venv layout of Linux")
def test_venv_whose_metadata_version_is_unreadable_is_refused_untouched(tmp_path: Path, project: Path) -> None:
    venv = _venv_with_wheel(tmp_path, build_wheel(tmp_path / "in"))
    (meta,) = venv.glob("lib/python3*/site-packages/vllm-*.dist-info/METADATA")
    meta.write_text(meta.read_text().replace("Version: 0.21.0", "Version: not-a-version"))
    before = _snapshot(venv)
    done = run_g4build("overlay", "--venv", str(venv), "--pin", "vllm-0.21.0")
    assert "Traceback" not in done.stderr and done.returncode == ValidationError.exit_code, done.stderr
    assert "expected a PEP 440 Version header, found 'not-a-version'" in done.stderr
    assert _snapshot(venv) == before


def test_venv_of_another_version_is_refused_untouched(tmp_path: Path, project: Path) -> None:
    venv = _venv_with_wheel(tmp_path, build_wheel(tmp_path / "in", version="0.33.0"))
    before = _snapshot(venv)
    done = run_g4build("overlay", "--venv", str(venv), "--pin", "vllm-0.21.0")
    assert done.returncode == 2 and "is vLLM 0.33.0" in done.stderr
    assert _snapshot(venv) == before


def test_overlay_without_wheel_fetches_the_pins_registry_wheel(tmp_path: Path, project: Path) -> None:
    wheel = build_wheel(tmp_path / "served")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    pins = yaml.safe_load((patches_dir() / "pins.yaml").read_text())
    pins["pins"]["vllm-0.21.0"]["wheels"] = {"manylinux_x86_64": {"file": wheel.name, "sha256": sha}}
    (project / "patches" / "pins.yaml").write_text(yaml_text(pins))
    with serve_index() as index:
        index.add(wheel)
        env = {"PIP_INDEX_URL": index.url, "G4BUILD_CACHE": str(tmp_path / "cache")}
        first = run_g4build("overlay", "--pin", "vllm-0.21.0", "--out", str(tmp_path / "out"), "--json", env=env)
        assert first.returncode == 0, first.stderr
        out = json.loads(first.stdout)
        assert out["validation"]["ok"] and (tmp_path / "cache" / "wheels" / wheel.name).is_file()
        inner = json.loads((tmp_path / "out" / "build-manifest.json").read_text())
        assert inner["source_wheel"] == {"file": wheel.name, "sha256": sha}
        second = run_g4build("overlay", "--pin", "vllm-0.21.0", "--out", str(tmp_path / "out2"), "--json", env=env)
        assert second.returncode == 0, second.stderr
        assert index.hits[f"/files/{wheel.name}"] == 1  # the second run reuses the cached, verified copy
