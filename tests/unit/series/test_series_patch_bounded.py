"""Patch files are read bounded wherever g4build reads them (the series check and apply, the overlay's patch
list, a fork port's fixups): a 3 GiB file is refused by its size unread, a FIFO or /dev/zero is refused without
hanging, and nothing in the tree changes. git applies the bytes g4build read, never the file by itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.support.hangs import within
from tests.unit.series.series_support import BASE, PIN, TEN, Diff, Home, make_tree, snapshot

from g4build.errors import ConfigError
from g4build.series.apply import apply_stack
from g4build.series.check import check_stack
from g4build.series.scratch import PatchFile
from g4build.source.forkport import _apply_fixups
from g4build.util.safeload import MAX_PATCH_BYTES

FOUND = {"sparse": f"{3 << 30} bytes, more than the {MAX_PATCH_BYTES}", "fifo": "FIFO", "dev-zero": "/dev/zero"}


def _spoil(patch: Path, kind: str) -> None:
    patch.unlink()
    if kind == "sparse":
        with open(patch, "wb") as fh:
            fh.truncate(3 << 30)  # 3 GiB of holes: no disk, and refused before a byte is read
    elif kind == "fifo":
        os.mkfifo(patch)
    else:
        patch.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind", list(FOUND))
def test_a_series_patch_that_is_no_small_regular_file_is_refused(
    home: Home, mkdiff: Diff, tmp_path: Path, kind: str,
) -> None:
    series = home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))])
    patch = series.patches_for(PIN)[0].path
    _spoil(patch, kind)
    tree = make_tree(tmp_path / "t", {"m.py": BASE})
    before = snapshot(tree)
    # the series loader names a FIFO without opening it and a link out of the folder; a sparse file is refused
    # when read
    found = {"sparse": FOUND[kind], "fifo": "found a named pipe, a device or a dangling link",
             "dev-zero": "resolves to /dev/zero"}[kind]
    with pytest.raises(ConfigError, match=found):
        within(lambda: check_stack(tree, home.stack(), variant_pin=PIN, version="1.0.0"), fifos=[patch])
    with pytest.raises(ConfigError, match=found):
        within(lambda: apply_stack(tree, home.stack(), pin=PIN, version="1.0.0"), fifos=[patch])
    assert snapshot(tree) == before


@pytest.mark.parametrize("kind", list(FOUND))
def test_a_series_patch_swapped_after_loading_is_refused_when_read(home: Home, mkdiff: Diff, kind: str) -> None:
    home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))])
    (patch,) = home.get("s").patches_for(PIN)  # loaded while a regular file, then replaced
    _spoil(patch.path, kind)
    with pytest.raises(ConfigError, match=FOUND[kind]):
        within(patch.read_bytes, fifos=[patch.path])


@pytest.mark.parametrize("kind", list(FOUND))
def test_an_overlay_patch_and_a_fork_fixup_are_read_bounded(tmp_path: Path, kind: str) -> None:
    patch = tmp_path / "0001-x.patch"
    patch.write_bytes(b"")
    _spoil(patch, kind)
    with pytest.raises(ConfigError, match=FOUND[kind]):
        within(lambda: PatchFile(label="s/0001-x.patch", path=patch).read_bytes(), fifos=[patch])
    tree = make_tree(tmp_path / "t", {"m.py": BASE})
    before = snapshot(tree)
    with pytest.raises(ConfigError, match=FOUND[kind]):
        within(lambda: _apply_fixups(tree, [patch]), fifos=[patch])
    assert snapshot(tree) == before


def test_a_fork_fixup_is_applied_from_the_bytes_read(mkdiff: Diff, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"m.py": BASE})
    patch = tmp_path / "0001-ten.patch"
    patch.write_bytes(mkdiff({"m.py": BASE}, {"m.py": TEN}))
    _apply_fixups(tree, [patch])
    assert (tree / "m.py").read_text() == TEN
