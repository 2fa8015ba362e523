"""Hostile images: writes through a skipped symlink, and gzip bombs (real layer tars and OCI layouts in tmp_path).

The bombs here declare their size in the tar header and carry only a little data, or are tiny real bombs under
small limits, so each test stays cheap whether or not the limits work.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest
from tests.unit.image.imagebuild import Entry, d, f, layer_tar, oci_layout, sym
from tests.unit.image.test_image_extract import PIN, SP, _image, _tree

from g4build.errors import UnsafeArchiveError
from g4build.image import extract_series
from g4build.image.layers import ApplyReport, Limits, apply_layers


def _apply(root: Path, *layers: list[Entry], limits: Limits | None = None) -> ApplyReport:
    streams = ((f"L{i}", io.BytesIO(layer_tar(e))) for i, e in enumerate(layers))
    return apply_layers(streams, root, limits=limits, select=lambda rel: rel.endswith(".py"))


def test_nothing_is_written_through_a_skipped_symlink(tmp_path: Path) -> None:
    root = tmp_path / "root"
    lower = [d("pkg/"), d("pkg/sub/"), f("pkg/sub/lower.py", "L = 1\n")]
    # The link climbs above the root, so it is skipped; in the image it replaces pkg/sub, and pkg/sub/evil.py
    # lands wherever the link points, never in a folder pkg/sub that the image does not have.
    upper = [sym("pkg/sub", "../../../../../etc"), f("pkg/sub/evil.py", "E = 1\n"),
             sym("pkg/alias", "sub"), f("pkg/alias/via-alias.py", "A = 1\n")]  # a safe link leading into it
    report = _apply(root, lower, upper)
    assert not os.path.lexists(root / "pkg" / "sub")
    assert not (root / "pkg" / "alias" / "via-alias.py").exists()
    skipped = {s.name: s for s in report.skipped}
    assert skipped["pkg/sub"].unsafe
    for name in ("pkg/sub/evil.py", "pkg/alias/via-alias.py"):
        assert skipped[name].unsafe and "goes through the symlink 'pkg/sub'" in skipped[name].reason
    assert report.files == 1  # only lower.py, which the upper layer then removed


def test_a_later_real_folder_replaces_the_skipped_link(tmp_path: Path) -> None:
    root = tmp_path / "root"
    report = _apply(root, [sym("pkg/sub", "../../../../x"), f("pkg/sub/before.py", "B\n")],
                    [d("pkg/sub/"), f("pkg/sub/after.py", "A\n")])
    assert (root / "pkg" / "sub" / "after.py").read_text() == "A\n"
    assert not (root / "pkg" / "sub" / "before.py").exists()
    assert {s.name for s in report.unsafe} == {"pkg/sub", "pkg/sub/before.py"}


def test_extract_does_not_put_a_file_behind_a_skipped_link_into_the_series(tmp_path: Path) -> None:
    image = _image(tmp_path, extra=[sym(f"{SP}/vllm/plugins", "../../../../../../../opt/plugins"),
                                    f(f"{SP}/vllm/plugins/evil.py", "import os\nos.system('x')\n")])
    out = tmp_path / "series" / "from-image"
    result = extract_series(image=str(image), pin=PIN, tree=_tree(tmp_path), out=out)
    assert "vllm/plugins/evil.py" not in result.changes.added
    patch = next((out / "vllm-0.21.0").glob("*.patch")).read_text()
    assert "plugins/evil.py" not in patch and "new_module.py" in patch


def _bomb_layer(first: Entry, name: str, declared: int, carried: int) -> bytes:
    """A tar of ``first`` then a member that declares ``declared`` bytes but carries only ``carried`` zero bytes
    (what a gzip bomb's stream looks like up to where the test stops reading)."""
    info = tarfile.TarInfo(first.name)
    info.size = len(first.data)
    info.mode = 0o644
    # header, data padded to a 512-byte block, and no end-of-archive blocks (the bomb member follows)
    head = info.tobuf(format=tarfile.PAX_FORMAT) + first.data + b"\0" * (-len(first.data) % 512)
    bomb = tarfile.TarInfo(name)
    bomb.size = declared
    bomb.mode = 0o644
    return head + bomb.tobuf(format=tarfile.PAX_FORMAT) + b"\0" * carried


def test_gzip_bomb_is_refused_at_the_header_with_the_default_limits(tmp_path: Path) -> None:
    # A 2 GiB .py inside a gzip layer of a few KB: the default per-file limit refuses it before any write.
    raw = _bomb_layer(f(f"{SP}/vllm/__init__.py", ""), f"{SP}/vllm/huge.py", declared=2 << 30, carried=256 << 10)
    layout = tmp_path / "image"
    oci_layout(layout, [raw])
    assert sum(p.stat().st_size for p in layout.rglob("*") if p.is_file()) < 64 << 10
    out = tmp_path / "series" / "bomb"
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(UnsafeArchiveError) as info:
        extract_series(image=str(layout), pin=PIN, tree=_tree(tmp_path), out=out, workdir=work)
    message = info.value.message
    assert "huge.py" in message and f"{2 << 30} bytes decompressed" in message
    assert f"over the {Limits().max_file_bytes} byte limit" in message
    assert not out.exists() and list(work.iterdir()) == []


def test_small_real_gzip_bomb_and_total_written_are_bounded(tmp_path: Path) -> None:
    bomb = gzip.compress(layer_tar([f("pkg/zeros.py", b"\0" * (4 << 20))]), mtime=0)
    assert len(bomb) < 64 << 10  # a real bomb: a few KB unpack to 4 MiB
    root = tmp_path / "root"
    with pytest.raises(UnsafeArchiveError, match=f"over the {1 << 20} byte limit"):
        apply_layers([("L0", gzip.GzipFile(fileobj=io.BytesIO(bomb)))], root, select=lambda _r: True,
                     limits=Limits(max_file_bytes=1 << 20))
    assert not (root / "pkg" / "zeros.py").exists()
    with pytest.raises(UnsafeArchiveError, match="would write over 150 bytes in all") as info:
        _apply(tmp_path / "root2", [f("a.py", b"1" * 80), f("b.py", b"2" * 80)], limits=Limits(max_written_bytes=150))
    assert "b.py" in info.value.message
    assert not (tmp_path / "root2" / "b.py").exists()
