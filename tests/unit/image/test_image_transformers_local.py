"""`--transformers` offline: a transformers release served by a loopback package index, built in the test."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.index_server import LocalIndex, serve_index
from tests.unit.image.imagebuild import f, layer_tar, oci_layout

from g4build.image import extract_series
from g4build.pins.model import load_pins
from g4build.series.model import load_series

SP = "usr/lib/python3/dist-packages"
MODEL = "transformers/models/gemma4"
RELEASE = {f"{MODEL}/__init__.py": b"", f"{MODEL}/configuration_gemma4.py": b"class Gemma4Config:\n    x = 1\n"}


def _wheel(version: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for rel, data in RELEASE.items():
            zf.writestr(rel, data)
        zf.writestr(f"{MODEL}/__pycache__/configuration_gemma4.cpython-312.pyc", b"\x00")
        zf.writestr(f"transformers-{version}.dist-info/METADATA", f"Name: transformers\nVersion: {version}\n")
    return buf.getvalue()


def _case(tmp: Path, version: str, gemma4: dict[str, bytes]) -> tuple[Path, Path]:
    tree = tmp / "pin-tree"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm/__init__.py").write_text("V = 1\n")
    entries = [f(f"{SP}/vllm/__init__.py", "V = 1\n"), f(f"{SP}/vllm-0.21.0.dist-info/METADATA", "Version: 0.21.0\n"),
               f(f"{SP}/transformers-{version}.dist-info/METADATA", f"Name: transformers\nVersion: {version}\n")]
    entries += [f(f"{SP}/{rel}", data) for rel, data in gemma4.items()]
    oci_layout(tmp / "image", [layer_tar(entries)])
    return tmp / "image", tree


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LocalIndex]:
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    with serve_index() as idx:
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        idx.add("transformers-9.1.0-py3-none-any.whl", _wheel("9.1.0"))
        yield idx


def test_a_release_on_the_index_gives_a_checked_patch(index: LocalIndex, tmp_path: Path) -> None:
    changed = {**RELEASE, f"{MODEL}/configuration_gemma4.py": b"class Gemma4Config:\n    x = 2\n"}
    image, tree = _case(tmp_path, "9.1.0", changed)
    out = tmp_path / "series" / "tf"
    result = extract_series(image=str(image), pin=load_pins().get("vllm-0.21.0"), tree=tree, out=out,
                            with_transformers=True)
    part = result.transformers
    assert part is not None and part.modified == (f"{MODEL}/configuration_gemma4.py",) and part.added == ()
    text = (out / "transformers-9.1.0" / "0001-gemma4-from-image.patch").read_text()
    assert "-    x = 1\n+    x = 2\n" in text and "pycache" not in text
    assert load_series(out).patches_for("vllm-0.21.0") == ()  # vLLM itself is unchanged


def test_equal_files_and_no_vllm_change_write_nothing(index: LocalIndex, tmp_path: Path) -> None:
    image, tree = _case(tmp_path, "9.1.0", RELEASE)
    out = tmp_path / "series" / "tf"
    result = extract_series(image=str(image), pin=load_pins().get("vllm-0.21.0"), tree=tree, out=out,
                            with_transformers=True)
    assert result.folder is None and not out.exists()
    assert result.transformers is not None and result.transformers.empty


def test_a_version_not_on_the_index_keeps_the_files(index: LocalIndex, tmp_path: Path) -> None:
    image, tree = _case(tmp_path, "9.2.0.dev0", {f"{MODEL}/modeling_gemma4.py": b"M = 1\n"})
    out = tmp_path / "series" / "tf"
    result = extract_series(image=str(image), pin=load_pins().get("vllm-0.21.0"), tree=tree, out=out,
                            with_transformers=True)
    assert result.transformers is not None and result.transformers.patch is None
    assert (out / "transformers-9.2.0.dev0" / "gemma4" / "modeling_gemma4.py").read_text() == "M = 1\n"
