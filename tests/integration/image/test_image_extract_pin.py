"""The image route against the real vllm-0.21.0 tree: an image carrying a changed upstream file becomes a
series whose patch applies to the pristine sdist tree; the command line does the same end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.trees import sdist_tree
from tests.unit.image.imagebuild import d, docker_save, f, files_under, layer_tar, oci_layout, sym

import g4build.source.fetch  # noqa: F401  # the command below runs fetch_source: shipped code must import, never skip
from g4build.image import extract_series
from g4build.pins.model import load_pins
from g4build.series.model import load_series

pytestmark = pytest.mark.network

SP = "usr/local/lib/python3.12/dist-packages"
FILES = ("vllm/__init__.py", "vllm/v1/spec_decode/dflash.py", "vllm/v1/spec_decode/eagle.py",
         "vllm/config/speculative.py")
CHANGED = "vllm/v1/spec_decode/dflash.py"


def _image_layers(tree: Path) -> list[bytes]:
    base = [d("usr/"), d("usr/local/"), sym("usr/local/python-site", "lib/python3.12/dist-packages")]
    base += [f(f"{SP}/{rel}", (tree / rel).read_bytes()) for rel in FILES]
    base.append(f(f"{SP}/vllm-0.21.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: vllm\nVersion: 0.21.0\n"))
    text = (tree / CHANGED).read_text()
    marker = "    def _warn_if_multimodal(self):\n"
    assert marker in text
    changed = text.replace(marker, "    # image fix: the draft model opts out of mm-prefix attention\n" + marker, 1)
    upper = [
        f(f"{SP}/{CHANGED}", changed),
        f(f"{SP}/vllm/v1/spec_decode/__pycache__/dflash.cpython-312.pyc", b"\x00\x01"),
        f(f"{SP}/vllm/_version.py", "__version__ = version = '0.21.0+spark'\n"),
        f(f"{SP}/vllm/config/.wh.speculative.py"),  # the image deleted it: reported as missing, not deleted
        f("../../escape-attempt", "x"),
    ]
    return [layer_tar(base), layer_tar(upper)]


def _git_apply_check(patch: Path, tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    return subprocess.run(["git", "apply", "--check", "-v", str(patch)], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)


def test_extract_from_a_docker_save_tarball_applies_to_the_pristine_tree(tmp_path: Path) -> None:
    tree = sdist_tree("vllm-0.21.0")
    archive = tmp_path / "images" / "spark.tar"
    archive.parent.mkdir()
    docker_save(archive, _image_layers(tree), tag="example.org/spark/vllm-gemma4:0.21.0")
    out = tmp_path / "series" / "spark-gemma4"
    result = extract_series(image=str(archive), pin=load_pins().get("vllm-0.21.0"), tree=tree, out=out)

    assert result.changes.modified == (CHANGED,) and result.changes.added == ()
    assert "vllm/config/speculative.py" in result.changes.missing
    assert [s.name for s in result.report.unsafe] == ["../../escape-attempt"]
    assert files_under(tmp_path) == {"images", *(f"images/{p}" for p in files_under(tmp_path / "images")),
                                     "series", *(f"series/{p}" for p in files_under(tmp_path / "series"))}
    (patch,) = load_series(out).patches_for("vllm-0.21.0")
    text = patch.path.read_text()
    assert text.startswith(f"diff --git a/{CHANGED} b/{CHANGED}\n") and text.count("diff --git") == 1
    assert "+    # image fix: the draft model opts out of mm-prefix attention" in text
    check = _git_apply_check(patch.path, tree)
    assert check.returncode == 0, check.stderr
    assert f"Checking patch {CHANGED}" in check.stderr


def test_the_command_line_writes_the_series_from_an_oci_layout(tmp_path: Path) -> None:
    tree = sdist_tree("vllm-0.21.0")
    layout = tmp_path / "layout"
    digest = oci_layout(layout, _image_layers(tree), ref="example.org/spark/vllm-gemma4:0.21.0")
    out = tmp_path / "series" / "from-cli"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "toolkit"), "COLUMNS": "300"}
    proc = subprocess.run(
        [sys.executable, "-m", "g4build", "image", "extract", str(layout), "--pin", "vllm-0.21.0",
         "--out", str(out), "--source", str(tree), "--json"],
        capture_output=True, text=True, env=env, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["series"] == "from-cli" and data["modified"] == [CHANGED]
    assert data["image"]["digest"] == digest and data["image"]["kind"] == "oci-layout"
    assert data["package_path"] == f"/{SP}/vllm" and data["image_vllm_version"] == "0.21.0"
    series = load_series(out)
    assert series.origin == f"example.org/spark/vllm-gemma4:0.21.0@{digest}"
    assert _git_apply_check(series.patches_for("vllm-0.21.0")[0].path, tree).returncode == 0


def test_the_human_output_prints_hostile_entry_names_as_text(tmp_path: Path) -> None:
    # Image entry names are the image author's text: one that looks like rich markup must be printed as it
    # is, not interpreted (a stray closing tag would crash the command after the series was written).
    tree = sdist_tree("vllm-0.21.0")
    base, upper = _image_layers(tree)
    hostile = "../[/yellow][bold red]x"
    layout = tmp_path / "layout"
    oci_layout(layout, [base, upper, layer_tar([f(hostile, "x")])], ref="example.org/spark/vllm-gemma4:0.21.0")
    out = tmp_path / "series" / "human"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "toolkit"), "COLUMNS": "300"}
    proc = subprocess.run(
        [sys.executable, "-m", "g4build", "image", "extract", str(layout), "--pin", "vllm-0.21.0",
         "--out", str(out), "--source", str(tree)],
        capture_output=True, text=True, env=env, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"{hostile}: absolute name or '..' leaves the image root" in proc.stdout
    assert f"wrote series human in {out}" in proc.stdout and load_series(out).name == "human"
