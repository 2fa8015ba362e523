"""The forward port on a small real fork repository: every change kind, entries that are not files, stale
keep_pin entries, and the fork's commits fetched from a remote that does not serve unadvertised shas."""

from __future__ import annotations

import os
from pathlib import Path

import git
import pytest

from g4build.errors import BaseConflictError
from g4build.forkport import port_onto
from g4build.pins import Base, FileRef, GitRef, Pin


def _fork(where: Path, with_symlink: bool) -> tuple[str, str]:
    repo = git.Repo.init(where)
    (where / "a.txt").write_text("one\ntwo\nthree\nfour\nfive\n")
    (where / "b.txt").write_text("bee\n")
    (where / "run.sh").write_text("echo hi\n")
    repo.index.add(["a.txt", "b.txt", "run.sh"])
    onto = repo.index.commit("onto").hexsha
    (where / "a.txt").write_text("one\ntwo\nthree\nfour\nFIVE (fork)\n")
    (where / "c.txt").write_text("sea\n")
    os.chmod(where / "run.sh", 0o755)
    repo.index.add(["a.txt", "c.txt", "run.sh"])
    repo.index.remove(["b.txt"], working_tree=True)
    if with_symlink:
        os.symlink("/etc/passwd", where / "link")
        repo.index.add(["link"])
    head = repo.index.commit("fork changes").hexsha
    return onto, head


def _pin(remote: Path, onto: str, head: str, keep: tuple[str, ...] = ()) -> Pin:
    base = Base(remote=str(remote), commit=head, onto=onto, keep_pin=keep)
    return Pin(name="test-pin", version="1.0", upstream=GitRef(remote="unused", commit="abcdef1"),
               sdist=FileRef(file="x.tar.gz", sha256="0" * 64), torch="2.11.0", cuda="13.0", flashinfer="0",
               bases={"windows": base})


def _tree(where: Path) -> Path:
    where.mkdir()
    (where / "a.txt").write_text("ONE (pin)\ntwo\nthree\nfour\nfive\n")
    (where / "b.txt").write_text("bee\n")
    (where / "run.sh").write_text("echo hi\n")
    git.Repo.init(where)
    return where


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))


def test_every_change_kind(tmp_path: Path) -> None:
    onto, head = _fork(tmp_path / "fork", with_symlink=False)
    tree = _tree(tmp_path / "tree")
    report = port_onto(tree, _pin(tmp_path / "fork", onto, head, keep=("never-changed.txt",)), "windows")
    assert (tree / "a.txt").read_text() == "ONE (pin)\ntwo\nthree\nfour\nFIVE (fork)\n"
    assert report.merged == ("a.txt",) and report.added == ("c.txt",) and report.deleted == ("b.txt",)
    assert report.taken == ("run.sh",) and os.stat(tree / "run.sh").st_mode & 0o111  # the fork's mode change
    assert not (tree / "b.txt").exists() and (tree / "c.txt").read_text() == "sea\n"
    assert report.warnings == ("keep_pin lists never-changed.txt, which the fork does not change: drop it",)


def test_a_symlink_in_the_fork_is_refused(tmp_path: Path) -> None:
    onto, head = _fork(tmp_path / "fork", with_symlink=True)
    tree = _tree(tmp_path / "tree")
    with pytest.raises(BaseConflictError, match=r"link \(not a regular file in the fork \(mode 000000 -> 120000\)"):
        port_onto(tree, _pin(tmp_path / "fork", onto, head), "windows")
    assert not (tree / "link").exists() and not (tree / "c.txt").exists()  # nothing written on a conflict
    # declared as kept, the port goes through without it
    report = port_onto(tree, _pin(tmp_path / "fork", onto, head, keep=("link",)), "windows")
    assert report.kept_pin == ("link",) and not (tree / "link").exists()
