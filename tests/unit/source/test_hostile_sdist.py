"""An sdist is upstream material: whatever VCS metadata it carries (a ``.git`` folder with ``core.fsmonitor`` and
hooks, a ``.git`` file pointing at a folder of the archive, other spellings of ``.git``) is never kept in the
extracted tree, and no git g4build runs on the tree reads a hook or an fsmonitor command from anywhere.

Each archive is built here; each fetch goes through a real loopback index; the hooks are real shell scripts that
would leave a mark if git ran them."""

from __future__ import annotations

import hashlib
import io
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
from tests.support.index_server import serve_index
from tests.support.yamltext import yaml_text

from g4build.pins.model import FileRef, GitRef, Pin
from g4build.source import gittree
from g4build.source.fetch import fetch_source, safe_extract_tar

VERSION = "9.9.0"
TOP = f"vllm-{VERSION}"


def _member(tar: tarfile.TarFile, name: str, data: bytes = b"", *, mode: int = 0o644, kind: bytes = tarfile.REGTYPE,
            link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _git_dir(tar: tarfile.TarFile, where: str, mark: Path, *, via_include: bool = False) -> None:
    """A repository's metadata under ``where`` whose fsmonitor and hooks append to ``mark`` when git runs them
    (``via_include``: the fsmonitor comes from a file the config includes)."""
    script = f"#!/bin/sh\necho ran >> '{mark}'\n".encode()
    fsmonitor = f"[core]\n\tfsmonitor = echo fsmonitor >> '{mark}'\n"
    config = "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
    config += "[include]\n\tpath = included\n" if via_include else fsmonitor
    _member(tar, f"{where}/HEAD", b"ref: refs/heads/main\n")
    _member(tar, f"{where}/config", config.encode())
    _member(tar, f"{where}/included", fsmonitor.encode())
    for hook in ("post-commit", "pre-commit", "post-checkout", "reference-transaction", "post-index-change"):
        _member(tar, f"{where}/hooks/{hook}", script, mode=0o755)


def _sdist(path: Path, extra: object) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        _member(tar, f"{TOP}/vllm/_version.py", f"__version__ = version = '{VERSION}'\n".encode())
        _member(tar, f"{TOP}/vllm/__init__.py", b"")
        extra(tar)  # type: ignore[operator]
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def _pin(sha256: str) -> Pin:
    return Pin(name=f"vllm-{VERSION}", version=VERSION,
               upstream=GitRef(remote="https://example.invalid/vllm", commit="0" * 40),
               sdist=FileRef(file=f"{TOP}.tar.gz", sha256=sha256), torch="2.9.0", cuda="13.0", flashinfer="0.5.0")


def _cases(mark: Path) -> dict[str, object]:
    return {
        "dot-git folder": lambda tar: _git_dir(tar, f"{TOP}/.git", mark),
        "dot-git folder, fsmonitor by an include": lambda tar: _git_dir(tar, f"{TOP}/.git", mark, via_include=True),
        "upper-case .GIT (a case-folding file system's .git)": lambda tar: _git_dir(tar, f"{TOP}/.GIT", mark),
        "NTFS trailing dot .git.": lambda tar: _git_dir(tar, f"{TOP}/.git.", mark),
        "nested .git in a sub-folder": lambda tar: _git_dir(tar, f"{TOP}/vllm/.git", mark),
        "gitfile pointing into the archive": lambda tar: (
            _git_dir(tar, f"{TOP}/evil", mark), _member(tar, f"{TOP}/.git", b"gitdir: evil\n")),
        "symlinked .git": lambda tar: (
            _git_dir(tar, f"{TOP}/evil", mark), _member(tar, f"{TOP}/.git", kind=tarfile.SYMTYPE, link="evil")),
        "8.3 short name GIT~1": lambda tar: _git_dir(tar, f"{TOP}/GIT~1", mark),
        "mercurial and subversion folders": lambda tar: (
            _member(tar, f"{TOP}/.hg/hgrc", f"[hooks]\ncommit = echo hg >> '{mark}'\n".encode()),
            _member(tar, f"{TOP}/.svn/entries", b"12\n")),
    }


CASES = sorted(_cases(Path("/x")))


def _vcs_left(root: Path) -> list[str]:
    names = {".git", ".hg", ".svn", ".bzr", "_darcs", "git~1"}
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name.lower().rstrip(". ") in names and not str(p.relative_to(root)).startswith(".git/"))


@pytest.mark.parametrize("case", CASES)
def test_extraction_keeps_no_vcs_metadata(tmp_path: Path, case: str) -> None:
    mark = tmp_path / "ran"
    arc = tmp_path / f"{TOP}.tar.gz"
    _sdist(arc, _cases(mark)[case])
    top = safe_extract_tar(arc, tmp_path / "out")
    assert (top / "vllm" / "_version.py").is_file()
    assert _vcs_left(top) == []
    assert not (top / ".git").exists() and not (top / ".git").is_symlink()


@pytest.mark.parametrize("case", CASES)
def test_source_fetch_runs_no_hook_or_fsmonitor_from_the_sdist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              case: str) -> None:
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    mark = tmp_path / "ran"
    body = _sdist(tmp_path / f"{TOP}.tar.gz", _cases(mark)[case])
    with serve_index() as idx:
        idx.add(f"{TOP}.tar.gz", body)
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        got = fetch_source(_pin(hashlib.sha256(body).hexdigest()), "sdist")
    tree = got.path
    assert not mark.exists(), mark.read_text()
    # the tree's repository is g4build's own: a fresh one, one commit, no hook, no fsmonitor, no include
    config = (tree / ".git" / "config").read_text()
    assert "fsmonitor" not in config and "include" not in config
    hooks = tree / ".git" / "hooks"
    assert not hooks.exists() or all(p.name.endswith(".sample") for p in hooks.iterdir())
    assert gittree.out(["rev-list", "--count", "HEAD"], cwd=tree) == "1"
    assert not mark.exists(), mark.read_text()
    # and later git runs on it (status reads the index: fsmonitor's moment) run nothing either
    gittree.dirty_paths(tree)
    assert not mark.exists()


def test_git_on_a_tree_with_hostile_metadata_runs_nothing(tmp_path: Path) -> None:
    """Belt and braces: were a hostile .git ever in a tree g4build runs git in (a user's checkout, a future route
    that forgets to strip), g4build's git still runs no hook, no fsmonitor and no included config."""
    mark = tmp_path / "ran"
    tree = tmp_path / "tree"
    tree.mkdir()
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    (tree / "f").write_text("x\n")
    git_dir = tree / ".git"
    with (git_dir / "config").open("a") as cfg:
        cfg.write(f"[core]\n\tfsmonitor = echo fsmonitor >> '{mark}'\n[include]\n\tpath = included\n")
    (git_dir / "included").write_text(f"[alias]\n\tst = !echo alias >> '{mark}'\n")
    for hook in ("post-commit", "pre-commit", "post-index-change", "reference-transaction"):
        (git_dir / "hooks" / hook).write_text(f"#!/bin/sh\necho {hook} >> '{mark}'\n")
        (git_dir / "hooks" / hook).chmod(stat.S_IRWXU)
    gittree.run_git(["add", "-A"], cwd=tree)
    gittree.run_git(["commit", "-q", "--no-verify", "-m", "x"], cwd=tree, env=gittree.identity_env(tree))
    gittree.dirty_paths(tree)
    assert not mark.exists(), mark.read_text()


# --- other encodings of the same tricks -----------------------------------------------------------------------

def _links_into_git(tar: tarfile.TarFile, mark: Path) -> None:
    _git_dir(tar, f"{TOP}/.git", mark)
    _member(tar, f"{TOP}/hooks", kind=tarfile.SYMTYPE, link=".git/hooks")  # a way back into dropped metadata
    _member(tar, f"{TOP}/cfg", kind=tarfile.LNKTYPE, link=f"{TOP}/.git/config")
    _member(tar, f"{TOP}/vllm/up", kind=tarfile.SYMTYPE, link="../.git")


def test_links_into_dropped_metadata_are_dropped_too(tmp_path: Path) -> None:
    arc = tmp_path / f"{TOP}.tar.gz"
    _sdist(arc, lambda tar: _links_into_git(tar, tmp_path / "ran"))
    top = safe_extract_tar(arc, tmp_path / "out")
    left = sorted(str(p.relative_to(top)) for p in top.rglob("*"))
    assert left == ["vllm", "vllm/__init__.py", "vllm/_version.py"]


@pytest.mark.parametrize("name", [
    f"{TOP}/vllm/a\r\nb.py", f"{TOP}/vllm/a\nb.py", f"{TOP}/vllm/a\u2028b.py", f"{TOP}/vllm/a\u202eb.py",
    f"{TOP}/vllm/a:stream", f"{TOP}/vllm\uff0f..\uff0f..\uff0fx", f"{TOP}/vllm/\u2024\u2024", f"{TOP}/vllm/a\x7fb",
])
def test_member_names_with_control_characters_or_disguised_separators_are_refused(tmp_path: Path, name: str) -> None:
    from g4build.errors import UnsafeArchiveError

    arc = tmp_path / f"{TOP}.tar.gz"
    _sdist(arc, lambda tar: _member(tar, name, b"x"))
    with pytest.raises(UnsafeArchiveError, match="refusing the archive"):
        safe_extract_tar(arc, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage", ["cut in half", "a flipped byte in the deflate data", "a gzip header only"])
def test_a_damaged_archive_is_a_clear_error(tmp_path: Path, damage: str) -> None:
    from g4build.errors import UnsafeArchiveError

    raw = _sdist(tmp_path / "good.tar.gz", lambda tar: _member(tar, f"{TOP}/big", b"x" * 100000))
    body = {"cut in half": raw[:len(raw) // 2], "a flipped byte in the deflate data": raw[:40] + bytes([raw[40] ^ 0xFF])
            + raw[41:], "a gzip header only": b"\x1f\x8b" + bytes(50)}[damage]
    (tmp_path / "bad.tar.gz").write_bytes(body)
    with pytest.raises(UnsafeArchiveError, match="not a readable tar archive"):
        safe_extract_tar(tmp_path / "bad.tar.gz", tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.extracting").exists()


def test_patches_check_and_port_of_a_hostile_sdist_run_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The commands of the finding, end to end: `patches check --pin` and `patches port --to` fetch the pin's
    sdist (with a .git of fsmonitor and hooks) from a loopback index and commit it; nothing of it runs."""
    import shutil

    import yaml

    from g4build.cli import main

    repo = Path(__file__).resolve().parents[3]
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("G4BUILD_PLAIN", "1")
    mark = tmp_path / "ran"
    body = _sdist(tmp_path / f"{TOP}.tar.gz", _cases(mark)["dot-git folder"])
    project = tmp_path / "project"
    shutil.copytree(repo / "patches", project / "patches")
    data = yaml.safe_load((repo / "patches" / "pins.yaml").read_text(encoding="utf-8"))
    data["pins"][f"vllm-{VERSION}"] = {
        "version": VERSION, "upstream": {"remote": "https://example.invalid/vllm.git", "commit": "0" * 40},
        "sdist": {"file": f"{TOP}.tar.gz", "sha256": hashlib.sha256(body).hexdigest()},
        "torch": "2.11.0", "cuda": "13.0", "flashinfer": "0.6.8", "wheels": {}, "bases": {}}
    (project / "patches" / "pins.yaml").write_text(yaml_text(data), encoding="utf-8")
    with serve_index() as idx:
        idx.add(f"{TOP}.tar.gz", body)
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        for args in (["patches", "check", "--pin", f"vllm-{VERSION}"],
                     ["patches", "port", "--all", "--to", f"vllm-{VERSION}"]):
            try:
                main(["--root", str(project), *args])
            except SystemExit as exc:
                assert exc.code != 1, capsys.readouterr().err  # a result or a clear error, not "unexpected"
    err = capsys.readouterr().err
    assert "unexpected" not in err.lower(), err
    assert idx.hits[f"/files/{TOP}.tar.gz"] == 1, err  # the sdist was fetched, extracted and committed
    assert not mark.exists(), mark.read_text()
    tree = tmp_path / "cache" / "trees" / f"vllm-{VERSION}" / "sdist"
    assert (tree / ".git" / "HEAD").is_file() and not (tree / ".git" / "hooks").exists()
