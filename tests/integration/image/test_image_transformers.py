"""`--transformers`: the image's Gemma 4 files in transformers, diffed against the same release from the index."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from tests.support.trees import sdist_tree
from tests.unit.image.imagebuild import f, layer_tar, oci_layout

from g4build.image import extract_series
from g4build.pins.index import cache_root, fetch_verified, project_files
from g4build.pins.model import load_pins
from g4build.series.model import load_series

pytestmark = pytest.mark.network

SP = "usr/lib/python3/dist-packages"
RELEASE = "5.5.4"
MODEL = "transformers/models/gemma4"


def _release_files() -> dict[str, bytes]:
    name = f"transformers-{RELEASE}-py3-none-any.whl"
    entry = next(x for x in project_files("transformers") if x.filename == name)
    wheel = fetch_verified("transformers", name, entry.sha256, cache_dir=cache_root() / "wheels")
    with zipfile.ZipFile(wheel.path) as zf:
        return {n: zf.read(n) for n in zf.namelist() if n.startswith(MODEL + "/") and n.endswith(".py")}


def _image(tmp: Path, version: str, gemma4: dict[str, bytes]) -> Path:
    tree = sdist_tree("vllm-0.21.0")
    entries = [f(f"{SP}/vllm/__init__.py", (tree / "vllm/__init__.py").read_bytes()),
               f(f"{SP}/vllm-0.21.0.dist-info/METADATA", "Name: vllm\nVersion: 0.21.0\n"),
               f(f"{SP}/transformers-{version}.dist-info/METADATA", f"Name: transformers\nVersion: {version}\n"),
               f(f"{SP}/transformers/models/llama/modeling_llama.py", "not selected\n")]
    entries += [f(f"{SP}/{rel}", data) for rel, data in gemma4.items()]
    layout = tmp / "image"
    oci_layout(layout, [layer_tar(entries)], ref="example.org/spark/vllm:tf")
    return layout


def test_gemma4_changes_against_the_release_become_a_checked_patch(tmp_path: Path) -> None:
    release = _release_files()
    assert f"{MODEL}/configuration_gemma4.py" in release
    changed = dict(release)
    cfg = f"{MODEL}/configuration_gemma4.py"
    changed[cfg] = release[cfg] + b"\n# image: gemma4_assistant model type registered here\n"
    changed[f"{MODEL}/assistant_gemma4.py"] = b"ASSISTANT = True\n"
    out = tmp_path / "series" / "tf-image"
    result = extract_series(image=str(_image(tmp_path, RELEASE, changed)), pin=load_pins().get("vllm-0.21.0"),
                            tree=sdist_tree("vllm-0.21.0"), out=out, with_transformers=True)
    part = result.transformers
    assert part is not None and part.version == RELEASE
    assert part.modified == (cfg,) and part.added == (f"{MODEL}/assistant_gemma4.py",)
    assert result.changes.empty and load_series(out).patches_for("vllm-0.21.0") == ()
    patch = out / f"transformers-{RELEASE}" / "0001-gemma4-from-image.patch"
    assert part.patch == patch.relative_to(out).as_posix()
    # applies to the release's own files, laid out as in site-packages
    site = tmp_path / "site"
    for rel, data in release.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path)}
    subprocess.run(["git", "apply", str(patch)], cwd=site, env=env, check=True)
    assert (site / cfg).read_bytes() == changed[cfg]
    assert (site / MODEL / "assistant_gemma4.py").read_text() == "ASSISTANT = True\n"
    assert "modeling_llama" not in patch.read_text()


def test_a_transformers_build_from_git_is_kept_as_files(tmp_path: Path) -> None:
    files = {f"{MODEL}/__init__.py": b"", f"{MODEL}/modeling_gemma4.py": b"class Gemma4: pass\n"}
    out = tmp_path / "series" / "tf-dev"
    result = extract_series(image=str(_image(tmp_path, "5.6.0.dev0", files)), pin=load_pins().get("vllm-0.21.0"),
                            tree=sdist_tree("vllm-0.21.0"), out=out, with_transformers=True)
    assert result.transformers is not None and result.transformers.patch is None
    kept = out / "transformers-5.6.0.dev0" / "gemma4"
    assert sorted(p.name for p in kept.iterdir()) == ["__init__.py", "modeling_gemma4.py"]
    assert (kept / "modeling_gemma4.py").read_text() == "class Gemma4: pass\n"
    assert "not a release" in load_series(out).pins["vllm-0.21.0"].note
