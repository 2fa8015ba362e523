"""remove_tree on a real git repository under Windows' rule that a read-only file cannot be deleted (git makes
its object files read-only). Linux lets root delete them, so the rule is simulated on os.unlink."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import git
import pytest

from g4build import fsutil
from g4build.fsutil import remove_tree, staging_dir, sweep_staging


@pytest.fixture
def windows_unlink(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    refused: list[str] = []
    real = os.unlink

    def unlink(path: Any, *, dir_fd: int | None = None) -> None:
        mode = os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode
        if not mode & stat.S_IWRITE:
            refused.append(str(path))
            raise PermissionError(13, "Access is denied", str(path))
        real(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "remove", unlink)
    return refused


def _repo(where: Path) -> Path:
    repo = git.Repo.init(where)
    (where / "f.txt").write_text("x\n")
    repo.index.add(["f.txt"])
    repo.index.commit("one")
    objects = [p for p in (where / ".git" / "objects").rglob("*") if p.is_file()]
    assert objects and all(not p.stat().st_mode & stat.S_IWRITE for p in objects)  # git's read-only objects
    return where


def test_plain_rmtree_leaves_half_a_tree(tmp_path: Path, windows_unlink: list[str]) -> None:
    tree = _repo(tmp_path / "src")
    shutil.rmtree(tree, ignore_errors=True)
    assert tree.exists() and windows_unlink  # what `rmtree(..., ignore_errors=True)` did on Windows


def test_remove_tree_deletes_read_only_files(tmp_path: Path, windows_unlink: list[str]) -> None:
    tree = _repo(tmp_path / "src")
    assert remove_tree(tree) is True
    assert not tree.exists() and windows_unlink
    assert remove_tree(tree) is True  # absent is fine
    single = tmp_path / "one.txt"
    single.write_text("x")
    os.chmod(single, stat.S_IREAD)
    assert remove_tree(single) is True and not single.exists()


@pytest.mark.skipif(os.name == "nt", reason="flock: POSIX (Windows only names leftovers)")
def test_sweep_removes_dead_staging_keeps_live_ones_and_never_follows_links(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep\n")
    (folder / ".g4build-planted.part").symlink_to(outside, target_is_directory=True)
    dead = folder / ".g4build-dead.part"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "big.whl").write_bytes(b"x" * 1000)
    (folder / "other.part").mkdir()  # not our name
    with staging_dir(folder) as live:
        assert live.name.startswith(".g4build-") and live.name.endswith(".part")
        removed, kept = sweep_staging(folder)  # the live one is locked by this open staging_dir
        assert (removed, kept) == ([dead], [live]) and live.is_dir()
    assert not live.exists()
    assert (outside / "precious.txt").read_text() == "keep\n" and (folder / ".g4build-planted.part").is_symlink()
    assert (folder / "other.part").is_dir()


@pytest.mark.skipif(os.name == "nt", reason="flock: POSIX (Windows only names leftovers)")
def test_a_sweep_right_after_the_folder_is_created_cannot_take_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The narrowest interleaving: another run sweeps the destination the moment mkdtemp has created the folder,
    before this run could lock it. The folder must not be sweepable yet, so it survives, locked."""
    folder = tmp_path / "out"
    folder.mkdir()
    real_mkdtemp = tempfile.mkdtemp
    sweeps: list[tuple[list[Path], list[Path]]] = []

    def mkdtemp_then_sweep(*args: Any, **kwargs: Any) -> str:
        made = real_mkdtemp(*args, **kwargs)
        sweeps.append(sweep_staging(folder))
        return made

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_then_sweep)
    with staging_dir(folder) as live:
        monkeypatch.undo()
        assert sweeps == [([], [])]  # the racing sweep saw nothing to take
        assert live.is_dir() and live.name.endswith(".part")
        (live / "wheel.whl").write_bytes(b"x")
        assert sweep_staging(folder) == ([], [live])  # once visible, it is locked
    assert list(folder.iterdir()) == []


@pytest.mark.skipif(os.name == "nt", reason="flock: POSIX (Windows only names leftovers)")
def test_a_claim_left_by_a_kill_is_removed_once_it_is_old(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    old = folder / ".g4build-killed.claim"
    young = folder / ".g4build-creating.claim"
    old.mkdir()
    young.mkdir()
    past = time.time() - fsutil.CLAIM_GRACE_S - 5
    os.utime(old, (past, past))
    assert sweep_staging(folder) == ([old], [])
    assert young.is_dir() and not old.exists()  # young: its run is about to lock and rename it


# --- write_atomic: whole or absent ---------------------------------------------------------------------------
def test_write_atomic_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "init-cache.cmake"
    fsutil.write_atomic(target, b"old\n")
    fsutil.write_atomic(target, b"new\n")
    assert target.read_bytes() == b"new\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["init-cache.cmake"]


def test_write_atomic_that_cannot_rename_keeps_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()  # a folder where the file should go: the rename fails after the data is written
    (target / "inside").write_text("kept\n")
    with pytest.raises(OSError):
        fsutil.write_atomic(target, b"new\n")
    assert (target / "inside").read_text() == "kept\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # the temporary went again
