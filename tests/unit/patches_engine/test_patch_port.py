"""`g4build patches port`: the real series carried between pins, on the real 0.33.0 sdist tree.

The tree comes from tests/support/trees.py (the pinned sdist, fetched once: `network`, offline afterwards) and is
only read; every file written lies in the test's tmp_path project.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.trees import sdist_tree

from g4build.patch_port import from_pin_for
from g4build.pins import load_pins
from g4build.series import load_all

REPO = Path(__file__).resolve().parents[3]
COPY = "vllm-0.33.0-copy"


def _project(tmp_path: Path) -> Path:
    """A copy of the project's patches/ with one more pin: the 0.33.0 release under another name."""
    root = tmp_path / "project"
    shutil.copytree(REPO / "patches", root / "patches")
    pins = root / "patches" / "pins.yaml"
    text = pins.read_text(encoding="utf-8")
    block = text[text.index("  vllm-0.33.0:\n"):].replace("  vllm-0.33.0:\n", f"  {COPY}:\n", 1)
    pins.write_text(text.rstrip("\n") + "\n\n" + block, encoding="utf-8")
    return root


def _g4build(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, G4BUILD_CACHE=str(tmp_path / "cache"), G4BUILD_PLAIN="1")
    return subprocess.run([sys.executable, "-m", "g4build", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_default_from_pin_is_the_nearest_one_with_a_variant(tmp_path: Path) -> None:
    pinset = load_pins(_project(tmp_path) / "patches" / "pins.yaml")
    for series in load_all(REPO / "patches"):
        assert from_pin_for(series, COPY, pinset) == "vllm-0.33.0"
        assert from_pin_for(series, "vllm-0.33.0", pinset) == "vllm-0.21.0"


def test_a_series_that_has_the_target_variant_is_refused(tmp_path: Path) -> None:
    root = _project(tmp_path)
    before = _digest(root / "patches")
    proc = _g4build(tmp_path, "--root", str(root), "patches", "port", "mm-prefix-fa", "--to", "vllm-0.33.0",
                    "--tree", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "already has a variant for vllm-0.33.0" in proc.stderr and "patches refresh" in proc.stderr
    assert _digest(root / "patches") == before


def test_from_a_pin_the_series_has_no_variant_for_is_refused(tmp_path: Path) -> None:
    root = _project(tmp_path)
    proc = _g4build(tmp_path, "--root", str(root), "patches", "port", "mm-prefix-fa", "--to", COPY,
                    "--from", COPY, "--tree", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert f"--from {COPY}: series mm-prefix-fa has no variant for it" in proc.stderr


@pytest.mark.network
def test_all_ports_only_the_series_without_a_variant_and_stops_at_a_conflict(tmp_path: Path) -> None:
    tree = sdist_tree("vllm-0.33.0")
    root = _project(tmp_path)
    args = ("--root", str(root), "patches", "port", "--all", "--to", COPY, "--tree", str(tree), "--json")
    first = _g4build(tmp_path, "--root", str(root), "patches", "port", "gemma4-backend-decoupling", "--to", COPY,
                     "--tree", str(tree))
    assert first.returncode == 0, first.stderr
    before = _digest(root / "patches")
    proc = _g4build(tmp_path, *args, "--from", "vllm-0.21.0", "--dry-run")
    assert proc.returncode == 8, proc.stderr
    out = json.loads(proc.stdout)
    assert [s["series"] for s in out["series"]] == ["dflash-batched-verification"]  # gemma4-… is laid down only
    assert out["not_tried"] == ["mm-prefix-fa"] and "not tried after it: mm-prefix-fa" in proc.stderr
    assert _digest(root / "patches") == before


@pytest.mark.network
def test_porting_to_the_same_release_gives_the_same_patches(tmp_path: Path) -> None:
    tree = sdist_tree("vllm-0.33.0")
    root = _project(tmp_path)
    before = _digest(root / "patches")
    args = ("--root", str(root), "patches", "port", "--all", "--to", COPY, "--tree", str(tree), "--json")
    dry = _g4build(tmp_path, *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert [s["written"] for s in json.loads(dry.stdout)["series"]] == [False, False, False]
    assert _digest(root / "patches") == before
    proc = _g4build(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    old, new = load_all(REPO / "patches"), {s.name: s for s in load_all(root / "patches")}
    for series in old:
        ported = new[series.name]
        assert ported.version == series.version + 1
        want = [(p.subject, p.read_bytes()) for p in series.patches_for("vllm-0.33.0")]
        assert [(p.subject, p.read_bytes()) for p in ported.patches_for(COPY)] == want
        variant, source = ported.variant(COPY), series.variant("vllm-0.33.0")
        assert variant is not None and source is not None
        assert variant.fingerprints == source.fingerprints
        assert variant.note.startswith("Ported from vllm-0.33.0")
        # the rest of series.yaml is kept line for line
        old_lines = (series.folder / "series.yaml").read_text().splitlines()[2:]
        assert (ported.folder / "series.yaml").read_text().splitlines()[2:len(old_lines) + 2] == old_lines
    check = _g4build(tmp_path, "--root", str(root), "patches", "check", "--pin", COPY, "--tree", str(tree))
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.network
def test_a_port_that_conflicts_writes_nothing_and_says_where(tmp_path: Path) -> None:
    tree = sdist_tree("vllm-0.33.0")
    root = _project(tmp_path)
    before = _digest(root / "patches")
    proc = _g4build(tmp_path, "--root", str(root), "patches", "port", "mm-prefix-fa", "--to", COPY,
                    "--from", "vllm-0.21.0", "--tree", str(tree), "--json")
    assert proc.returncode == 8, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is False and out["series"][0]["written"] is False
    conflict = out["series"][0]["patches"][0]
    assert conflict["status"] == "conflict" and "vllm/platforms/cuda.py" in conflict["detail"]
    assert "nothing of it was written" in proc.stderr
    assert _digest(root / "patches") == before
