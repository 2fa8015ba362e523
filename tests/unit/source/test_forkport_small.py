"""The forward port on small real fork repositories: every change kind, entries that are not files, stale
keep_pin entries, case-only renames, the user's autocrlf, an onto that is not below the fork head, and the
fork's commits fetched from a remote that does not serve unadvertised shas."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import git
import pytest

from g4build.errors import BaseConflictError, ConfigError
from g4build.pins.model import Base, FileRef, GitRef, Pin
from g4build.source.base import base_digest
from g4build.source.forkport import port_onto, posix_only_imports


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


def test_fetch_falls_back_to_refs_when_the_server_refuses_unadvertised_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    onto, head = _fork(tmp_path / "fork", with_symlink=False)
    repo = git.Repo(tmp_path / "fork")
    (tmp_path / "fork" / "later.txt").write_text("the fork moved on\n")
    repo.index.add(["later.txt"])
    repo.index.commit("after the pinned head")  # the pinned head is no longer a branch tip: not advertised
    # protocol v0 refuses a want for an unadvertised sha, as servers without allowAnySHA1InWant do
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "protocol.version")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "0")
    tree = _tree(tmp_path / "tree")
    report = port_onto(tree, _pin(tmp_path / "fork", onto, head), "windows")
    assert report.merged == ("a.txt",) and not (tree / "later.txt").exists()


def test_onto_must_be_an_ancestor_of_the_fork_commit(tmp_path: Path) -> None:
    onto, head = _fork(tmp_path / "fork", with_symlink=False)
    repo = git.Repo(tmp_path / "fork")
    side = repo.create_head("side", onto)
    side.checkout()
    (tmp_path / "fork" / "a.txt").write_text("unrelated\n")
    repo.index.add(["a.txt"])
    stray = repo.index.commit("not below the fork head").hexsha
    with pytest.raises(ConfigError, match=f"onto {stray} is not an ancestor of the fork commit {head}"):
        port_onto(_tree(tmp_path / "tree"), _pin(tmp_path / "fork", stray, head), "windows")


def test_a_case_only_rename_is_refused(tmp_path: Path) -> None:
    where = tmp_path / "fork"
    repo = git.Repo.init(where)
    (where / "Readme.txt").write_text("x\n")
    repo.index.add(["Readme.txt"])
    onto = repo.index.commit("onto").hexsha
    repo.index.remove(["Readme.txt"], working_tree=True)
    (where / "README.txt").write_text("x\n")
    repo.index.add(["README.txt"])
    head = repo.index.commit("rename").hexsha
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "Readme.txt").write_text("x\n")
    git.Repo.init(tree)
    with pytest.raises(BaseConflictError, match="only changes case"):
        port_onto(tree, _pin(where, onto, head), "windows")
    assert (tree / "Readme.txt").read_text() == "x\n"


def test_line_endings_do_not_follow_the_users_autocrlf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Git for Windows defaults to core.autocrlf=true; a fixup applied under it must not write CRLF."""
    from g4build.source import forkport

    config = tmp_path / "gitconfig"
    config.write_text("[core]\n\tautocrlf = true\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    fixups = tmp_path / "fixups"
    fixups.mkdir()
    (fixups / "0001-b.patch").write_text(
        "--- a/b.txt\n+++ b/b.txt\n@@ -1 +1 @@\n-bee\n+bee (fixup)\n")
    monkeypatch.setattr(forkport, "fixup_patches", lambda os_name, pin: sorted(fixups.glob("*.patch")))
    onto, head = _fork(tmp_path / "fork", with_symlink=False)
    tree = _tree(tmp_path / "tree")
    (tree / "b.txt").write_text("bee\n")
    report = port_onto(tree, _pin(tmp_path / "fork", onto, head, keep=("b.txt",)), "windows")
    assert report.fixups == ("0001-b.patch",)
    assert (tree / "b.txt").read_bytes() == b"bee (fixup)\n"


def test_base_digest_follows_what_the_port_takes(tmp_path: Path) -> None:
    pin = _pin(tmp_path / "fork", "a" * 40, "b" * 40)
    kept = _pin(tmp_path / "fork", "a" * 40, "b" * 40, keep=("x.txt",))
    other = _pin(tmp_path / "fork", "a" * 40, "c" * 40)
    assert len({base_digest(pin, "windows"), base_digest(kept, "windows"), base_digest(other, "windows")}) == 3
    assert base_digest(pin, "windows") == base_digest(_pin(tmp_path / "fork", "a" * 40, "b" * 40), "windows")


def test_posix_only_imports(tmp_path: Path) -> None:
    (tmp_path / "vllm" / "sub").mkdir(parents=True)
    (tmp_path / "vllm" / "ok.py").write_text("import os\nif os.name != 'nt':\n    import fcntl\n")
    (tmp_path / "vllm" / "sub" / "bad.py").write_text('"""doc"""\nimport fcntl\n')
    (tmp_path / "vllm" / "loop.py").write_text("from uvloop import run\n")
    assert posix_only_imports(tmp_path) == ["vllm/loop.py imports uvloop at the top level",
                                            "vllm/sub/bad.py imports fcntl at the top level"]


def test_a_file_where_the_pin_has_a_folder_is_a_conflict_and_deletes_leave_no_empty_folders(tmp_path: Path) -> None:
    where = tmp_path / "fork"
    repo = git.Repo.init(where)
    (where / "deep" / "er").mkdir(parents=True)
    (where / "deep" / "er" / "gone.txt").write_text("x\n")
    repo.index.add(["deep/er/gone.txt"])
    onto = repo.index.commit("onto").hexsha
    repo.index.remove(["deep/er/gone.txt"], working_tree=True)
    head = repo.index.commit("delete").hexsha
    tree = tmp_path / "tree"
    (tree / "deep" / "er").mkdir(parents=True)
    (tree / "deep" / "er" / "gone.txt").write_text("x\n")
    (tree / "keep.txt").write_text("k\n")
    git.Repo.init(tree)
    report = port_onto(tree, _pin(where, onto, head), "windows")
    assert report.deleted == ("deep/er/gone.txt",) and not (tree / "deep").exists() and (tree / "keep.txt").exists()

    (where / "deep").mkdir()
    (where / "deep" / "x.txt").write_text("fork\n")
    repo.index.add(["deep/x.txt"])
    head2 = repo.index.commit("add under deep").hexsha
    (tree / "deep").write_text("the pin has a file here\n")
    with pytest.raises(BaseConflictError, match=r"deep/x.txt \(a file in the fork where the pin has a folder"):
        port_onto(tree, _pin(where, head, head2), "windows")


def _hostile_fork(where: Path, entry: str) -> tuple[str, str]:
    """A fork whose head adds a tree entry git itself would never check out (made with git's plumbing, as a
    hostile server could serve it): ``entry`` is 'folder/name' of a blob that runs a command if it is a hook."""
    onto, _ = _fork(where, with_symlink=False)
    run = lambda *a, stdin=None: subprocess.run(["git", *a], cwd=where, check=True, capture_output=True,  # noqa: E731
                                                input=stdin).stdout.decode().strip()
    blob = run("hash-object", "-w", "--stdin", stdin=b"[core]\n\tfsmonitor = touch pwned\n")
    folder, name = entry.split("/")
    inner = run("mktree", stdin=f"100644 blob {blob}\t{name}\n".encode())
    top = run("ls-tree", onto).splitlines()
    listing = "\n".join([*top, f"040000 tree {inner}\t{folder}"]) + "\n"
    tree = run("mktree", stdin=listing.encode())
    head = run("-c", "user.name=t", "-c", "user.email=t@t", "commit-tree", tree, "-p", onto, "-m", "hostile")
    return onto, head


@pytest.mark.parametrize("entry", [".git/config", ".GIT/config", "../config", "git~1/config", "a\\b/config"])
def test_a_fork_entry_inside_vcs_metadata_or_outside_the_tree_is_refused(tmp_path: Path, entry: str) -> None:
    from g4build.errors import SourceError

    try:
        onto, head = _hostile_fork(tmp_path / "fork", entry)
    except subprocess.CalledProcessError:
        pytest.skip(f"git's mktree refuses {entry!r} itself")
    tree = _tree(tmp_path / "tree")
    before = (tree / ".git" / "config").read_bytes()
    with pytest.raises(SourceError, match="expected paths inside the tree"):
        port_onto(tree, _pin(tmp_path / "fork", onto, head), "windows")
    assert (tree / ".git" / "config").read_bytes() == before
    assert not (tmp_path / "pwned").exists() and not (tree / "pwned").exists()
