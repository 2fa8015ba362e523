from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from g4build.errors import UnsafeArchiveError
from g4build.source.fetch import safe_extract_tar


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _link(name: str, target: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def _everything_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_good_archive_extracts_to_single_top(tmp_path: Path) -> None:
    members = [_file("pkg-1.0/a.py", b"print(1)\n"), _link("pkg-1.0/l", "a.py", tarfile.SYMTYPE)]
    arc = _tar(tmp_path / "ok.tar.gz", members)
    top = safe_extract_tar(arc, tmp_path / "out")
    assert top == tmp_path / "out" / "pkg-1.0"
    assert (top / "a.py").read_bytes() == b"print(1)\n"
    assert (top / "l").is_symlink()


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_file("pkg/../../evil"), "'..'"),
        (_file("/etc/evil"), "absolute path"),
        (_file("C:/evil"), "absolute path"),
        (_file("pkg\\..\\..\\evil"), "backslash"),
        (_link("pkg/link", "../../outside", tarfile.SYMTYPE), "symlink"),
        (_link("pkg/link", "/etc/passwd", tarfile.SYMTYPE), "symlink"),
        (_link("pkg/hard", "../outside", tarfile.LNKTYPE), "hardlink"),
        (_link("pkg/dev", "", tarfile.CHRTYPE), "device"),
    ],
)
def test_hostile_archive_writes_nothing(tmp_path: Path, member: tuple[tarfile.TarInfo, bytes | None], why: str) -> None:
    box = tmp_path / "box"
    box.mkdir()
    arc = _tar(tmp_path / "bad.tar.gz", [_file("pkg/ok.py"), member, _file("pkg/after.py")])
    before = _everything_under(tmp_path)
    with pytest.raises(UnsafeArchiveError) as info:
        safe_extract_tar(arc, box / "out")
    assert why in info.value.message
    assert _everything_under(tmp_path) == before  # nothing extracted anywhere, no temp left


def test_not_a_tar_is_a_clear_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball")
    with pytest.raises(UnsafeArchiveError, match="not a readable tar"):
        safe_extract_tar(junk, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_link_chain_that_names_hide_is_refused(tmp_path: Path) -> None:
    """Each link looks inside the tree by its names, but the second resolves through the first and escapes."""
    box = tmp_path / "box"
    box.mkdir()
    members = [
        _file("pkg/a/b/c/ok.py"),
        _link("pkg/a/b/c/d", "../..", tarfile.SYMTYPE),  # -> pkg/a
        _link("pkg/a/b/c/d/e", "../../../../..", tarfile.SYMTYPE),  # via d: pkg/a + 5 levels up = outside
    ]
    arc = _tar(tmp_path / "chain.tar.gz", members)
    before = _everything_under(tmp_path)
    with pytest.raises(UnsafeArchiveError) as info:
        safe_extract_tar(arc, box / "out")
    assert "not a readable" not in info.value.message
    assert info.value.hint and "nothing was extracted" in info.value.hint
    assert _everything_under(tmp_path) == before
