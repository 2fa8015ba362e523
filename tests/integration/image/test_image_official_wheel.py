"""The noise filter against reality: an image holding the official vllm-0.21.0 wheel, installed as pip lays it
out, carries no change against the pin's sdist, so no series is written."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from tests.support.trees import sdist_tree
from tests.unit.image.imagebuild import Entry, f, layer_tar, oci_layout

from g4build.image import extract_series
from g4build.pins.index import cache_root, fetch_verified
from g4build.pins.model import load_pins

pytestmark = [pytest.mark.network, pytest.mark.heavy]

SP = "usr/local/lib/python3.12/dist-packages"


def test_the_official_wheel_installed_in_an_image_is_no_change(tmp_path: Path) -> None:
    pin = load_pins().get("vllm-0.21.0")
    ref = pin.wheels["manylinux_x86_64"]
    wheel = fetch_verified("vllm", ref.file, ref.sha256, cache_dir=cache_root() / "wheels").path
    entries: list[Entry] = []
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            # compiled objects only matter by name here (the filter drops them), so keep the layer small
            data = b"\x7fELF" if name.endswith(".so") else zf.read(name)
            entries.append(f(f"{SP}/{name}", data))
            entries.append(f(f"{SP}/{name.rsplit('/', 1)[0]}/__pycache__/x.cpython-312.pyc", b"\x00"))
    layout = tmp_path / "image"
    oci_layout(layout, [layer_tar(entries)], gzip_layers=False)
    out = tmp_path / "series" / "official"
    result = extract_series(image=str(layout), pin=pin, tree=sdist_tree(pin.name), out=out)
    assert result.image_vllm_version == "0.21.0" and result.warnings == ()
    assert result.changes.modified == () and result.changes.added == ()
    assert result.changes.missing == ()
    assert result.folder is None and not out.exists()
