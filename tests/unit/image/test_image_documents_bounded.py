"""An image's JSON documents (index.json, manifests, configs) are read as every file g4build did not write:
nesting 200k deep, NaN, 1e999 or a 4000-digit number are an ImageError naming the document, never a
RecursionError; an image path or document that is a FIFO is refused without hanging."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.support.hangs import within
from tests.unit.image.imagebuild import f, layer_tar, oci_layout, tar_folder

from g4build.errors import ImageError
from g4build.image.layers import apply_layers
from g4build.image.sources import open_image

LAYER = layer_tar([f("app/one.py", "1\n")])

HOSTILE = {
    "nested 200k deep": (b'{"manifests": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", "nested too deeply"),
    "nested past the bound": (b'{"manifests": ' + b"[" * 100 + b"]" * 100 + b"}", "deeper than 64"),
    "NaN": (b'{"schemaVersion": NaN, "manifests": []}', "NaN is not a number"),
    "1e999": (b'{"schemaVersion": 1e999, "manifests": []}', "not a finite number"),
    "4000 digits": (b'{"schemaVersion": ' + b"7" * 4000 + b', "manifests": []}', "4000 digits"),
}


def _unpack(image: Path, root: Path) -> None:
    with open_image(str(image)) as opened:
        apply_layers(opened.layers, root)


@pytest.mark.parametrize(("content", "needle"), HOSTILE.values(), ids=list(HOSTILE))
@pytest.mark.parametrize("packed", [False, True], ids=["folder", "tarball"])
def test_a_hostile_index_json_is_an_image_error(tmp_path: Path, content: bytes, needle: str, packed: bool) -> None:
    layout = tmp_path / "layout"
    oci_layout(layout, [LAYER])
    (layout / "index.json").write_bytes(content)
    image = tar_folder(layout, tmp_path / "image.tar") if packed else layout
    with pytest.raises(ImageError, match=needle) as caught:
        _unpack(image, tmp_path / "root")
    assert "index.json" in caught.value.message
    assert not (tmp_path / "root").exists()


def test_an_image_or_a_document_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "image.tar"
    os.mkfifo(fifo)
    with pytest.raises(ImageError, match="neither a folder nor a regular file"):
        within(lambda: _unpack(fifo, tmp_path / "root"), fifos=[fifo])
    layout = tmp_path / "layout"
    oci_layout(layout, [LAYER])
    (layout / "index.json").unlink()
    os.mkfifo(layout / "index.json")
    with pytest.raises(ImageError, match="neither a `docker save` archive"):
        within(lambda: _unpack(layout, tmp_path / "root"), fifos=[layout / "index.json"])
    assert not (tmp_path / "root").exists()
