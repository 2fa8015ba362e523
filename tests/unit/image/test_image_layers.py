"""Layer application: whiteouts, opaque folders, links, hostile entries, limits (real tar streams)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from tests.unit.image.imagebuild import Entry, d, f, files_under, hard, layer_tar, sym

from g4build.errors import UnsafeArchiveError
from g4build.image.layers import Limits, apply_layers, clean_member_name, resolve_in_root

SP = "usr/lib/python3.12/site-packages"


def _lexists(path: Path) -> bool:
    return os.path.lexists(path)


def _apply(root: Path, *layers: list[Entry], **kw: object) -> object:
    return apply_layers(((f"L{i}", io.BytesIO(layer_tar(e))) for i, e in enumerate(layers)), root, **kw)  # type: ignore[arg-type]


def test_hostile_layers_stay_inside_and_the_result_is_right(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    root = sandbox / "root"
    outside = tmp_path / "outside"  # a real host folder an absolute symlink names
    outside.mkdir()
    base = [
        d("usr/"), d("usr/lib/"), d("usr/lib/python3.12/"), d(f"{SP}/"), d(f"{SP}/vllm/"),
        f(f"{SP}/vllm/__init__.py", "init\n"), f(f"{SP}/vllm/a.py", "a1\n"), f(f"{SP}/vllm/old.py", "old\n"),
        d(f"{SP}/vllm/gone/"), f(f"{SP}/vllm/gone/x.py", "x\n"),
        d("opq/"), f("opq/lower1", "1"), f("opq/lower2", "2"), d("etc/"), f("etc/hosts", "h"),
    ]
    upper = [
        f(f"{SP}/vllm/.wh.old.py"), f(f"{SP}/vllm/.wh.gone"),
        f("opq/new", "n"), f("opq/.wh..wh..opq"),  # marker after a same-layer entry: that entry survives
        f(f"{SP}/vllm/a.py", "a2\n"),
        sym("escape", "../../../.."), f("escape/pwned-rel", "x"),
        sym("hostabs", str(outside)), f("hostabs/pwned-abs", "x"),
        sym("etclink", "/etc"), f("etclink/via-link", "v"),
        sym(f"{SP}/inside", "../../../../etc"),
        f("../dotdot-evil", "x"), f("/abs-evil", "x"), f("usr/../../climb-evil", "x"),
        hard("hl-out", "../../outside/victim"), hard("hl-abs", "/etc/hosts"),
        hard(f"{SP}/vllm/a_copy.py", f"{SP}/vllm/a.py"),
        Entry(name="dev/fifo", kind="fifo"), Entry(name="dev/null", kind="chr"),
    ]
    (outside / "victim").write_text("host file")
    report = _apply(root, base, upper)

    assert files_under(tmp_path) - {"sandbox", "sandbox/root", "outside", "outside/victim"} == {
        f"sandbox/root/{p}" for p in files_under(root)
    }, "an entry landed outside the root"
    assert files_under(outside) == {"victim"} and (outside / "victim").read_text() == "host file"
    vllm = root / SP / "vllm"
    assert sorted(p.name for p in vllm.iterdir()) == ["__init__.py", "a.py", "a_copy.py"]
    assert (vllm / "a.py").read_text() == "a2\n" and (vllm / "a_copy.py").read_text() == "a2\n"
    assert sorted(p.name for p in (root / "opq").iterdir()) == ["new"]
    assert (root / "etc" / "via-link").read_text() == "v"  # an absolute link is read against the root
    assert (root / outside.relative_to(outside.anchor) / "pwned-abs").read_text() == "x"
    assert os.readlink(root / SP / "inside") == "../../../../etc"
    # the refused link is not there, and neither is the file meant to go through it: the image has no such file
    assert not _lexists(root / "escape")
    assert not (root / "dev" / "fifo").exists() and not (root / "dev" / "null").exists()
    skipped = {s.name: s for s in report.skipped}  # type: ignore[attr-defined]
    for name in ("escape", "escape/pwned-rel", "../dotdot-evil", "/abs-evil", "usr/../../climb-evil", "hl-out",
                 "hl-abs"):
        assert skipped[name].unsafe, name
    assert not skipped["dev/fifo"].unsafe and not skipped["dev/null"].unsafe


def test_whiteout_hides_lower_layers_only(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _apply(root, [f("a/keep", "lower"), f("a/drop", "lower")], [f("a/keep", "upper"), f("a/.wh.keep"), f("a/.wh.drop")])
    assert (root / "a" / "keep").read_text() == "upper"
    assert not (root / "a" / "drop").exists()


def test_whiteouts_of_dot_and_dotdot_delete_nothing(tmp_path: Path) -> None:
    root = tmp_path / "sandbox" / "root"
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "sandbox" / "sibling.txt").write_text("keep")
    report = _apply(root, [f("a/keep", "1"), f("top", "2")], [f(".wh..."), f("a/.wh.."), f("a/.wh...")])
    assert (tmp_path / "sandbox" / "sibling.txt").read_text() == "keep"
    assert (root / "a" / "keep").read_text() == "1" and (root / "top").read_text() == "2"
    assert sum(s.unsafe for s in report.skipped) == 3  # type: ignore[attr-defined]


def test_a_file_replaces_a_lower_folder_and_a_link_is_never_written_through(tmp_path: Path) -> None:
    root = tmp_path / "root"
    target = tmp_path / "host.txt"
    target.write_text("host")
    _apply(root, [f("x/inner", "1"), sym("y", str(target))], [f("x", "now a file"), f("y", "replaced")])
    assert (root / "x").read_text() == "now a file"
    assert not (root / "y").is_symlink() and (root / "y").read_text() == "replaced"
    assert target.read_text() == "host"


def test_only_selected_files_are_written(tmp_path: Path) -> None:
    root = tmp_path / "root"
    layer = [f("big/blob.bin", b"0" * 1000), f("keep/me.py", "1")]
    report = _apply(root, layer, select=lambda rel: rel.endswith(".py"))
    assert (root / "keep" / "me.py").is_file() and not (root / "big" / "blob.bin").exists()
    assert report.files == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(("limits", "what"), [
    (Limits(max_member_bytes=100), "over the 100 limit"),
    (Limits(max_total_bytes=190), "unpacks to over 190"),
    (Limits(max_members=2), "more than 2 members"),
])
def test_limits_refuse_the_image(tmp_path: Path, limits: Limits, what: str) -> None:
    with pytest.raises(UnsafeArchiveError, match=what):
        _apply(tmp_path / "root", [f("a", b"1" * 80), f("b", b"2" * 120), f("c", b"3")], limits=limits)


def test_a_link_loop_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with pytest.raises(UnsafeArchiveError, match="link loop"):
        _apply(root, [sym("l1", "l2"), sym("l2", "l1"), f("l1/file", "x")])


def test_resolution_is_clamped_to_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "up").symlink_to("../../../../..")
    (root / "a" / "abs").symlink_to("/a")
    assert resolve_in_root(root, "a/up/etc/passwd") == "etc/passwd"
    assert resolve_in_root(root, "a/abs/abs/up/x") == "x"
    assert resolve_in_root(root, "a/abs", follow_final=False) == "a/abs"
    assert clean_member_name("./usr//lib/./x") == "usr/lib/x"
    assert clean_member_name("a/../b") is None and clean_member_name("/etc") is None
    assert clean_member_name("C:/Windows") is None


def test_a_broken_layer_is_an_archive_error(tmp_path: Path) -> None:
    with pytest.raises(UnsafeArchiveError, match="not a readable tar"):
        apply_layers([("bad", io.BytesIO(b"not a tar" * 100))], tmp_path / "root")
