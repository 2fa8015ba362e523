"""Real source acquisition: the vllm-0.21.0 sdist from the package index, a real git remote, a real path."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import git
import pytest
from tests.support.index_server import serve_index
from tests.support.yamltext import yaml_text

from g4build.errors import IntegrityError, SourceError, UsageError
from g4build.pins.index import cache_root, sha256_file
from g4build.pins.model import load_pins
from g4build.source.fetch import fetch_source, read_version_file, verify_tree

PIN = "vllm-0.21.0"


@pytest.fixture(scope="module")
def sdist_archive() -> Path:
    """The real sdist, downloaded once into the machine's g4build cache (verified)."""
    from g4build.pins.index import fetch_verified

    pin = load_pins().get(PIN)
    return fetch_verified("vllm", pin.sdist.file, pin.sdist.sha256, cache_dir=cache_root() / "sdists").path


@pytest.mark.network
def test_sdist_fetch_then_offline_reuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sdist_archive: Path
) -> None:
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    pin = load_pins().get(PIN)
    first = fetch_source(pin, "sdist")
    assert not first.cached
    assert first.verified == f"sha256:{pin.sdist.sha256}"
    assert sha256_file(tmp_path / "cache" / "sdists" / pin.sdist.file) == pin.sdist.sha256
    repo = git.Repo(first.path)
    assert [c.message.strip() for c in repo.iter_commits()] == ["upstream vllm 0.21.0"]
    assert not repo.is_dirty(untracked_files=True)
    assert read_version_file(first.path) == ("0.21.0", "9da56fd18")
    assert "vllm/_version.py" in repo.git.ls_files("vllm/_version.py")  # generated files are committed too

    with monkeypatch.context() as m:  # second fetch: no network at all
        m.setattr(socket.socket, "connect", lambda *a, **k: (_ for _ in ()).throw(OSError("blocked")))
        again = fetch_source(pin, "sdist")
        assert again.cached and again.path == first.path
        # the tree is gone but the verified archive is cached: rebuilt offline
        shutil.rmtree(first.path)
        rebuilt = fetch_source(pin, "sdist")
        assert not rebuilt.cached and (rebuilt.path / "vllm" / "__init__.py").is_file()


@pytest.mark.network
def test_tampered_sdist_is_refused_and_nothing_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sdist_archive: Path
) -> None:
    data = bytearray(sdist_archive.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte changed
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    pin = load_pins().get(PIN)
    with serve_index() as idx:
        idx.add(pin.sdist.file, bytes(data), publish_sha256=pin.sdist.sha256)  # a mirror lying about its bytes
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        with pytest.raises(IntegrityError, match="sha256 mismatch"):
            fetch_source(pin, "sdist")
    leftovers = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert leftovers == []


def _make_upstream(tmp_path: Path) -> tuple[Path, str]:
    remote = tmp_path / "upstream"
    repo = git.Repo.init(remote)
    (remote / "vllm").mkdir()
    (remote / "vllm" / "__init__.py").write_text("")
    repo.git.add("-A")
    repo.git.commit("-m", "one", "--no-gpg-sign")
    (remote / "README.md").write_text("two\n")
    repo.git.add("-A")
    repo.git.commit("-m", "two", "--no-gpg-sign")
    repo.git.tag("v9.9.0")
    (remote / "README.md").write_text("three\n")
    repo.git.commit("-am", "three", "--no-gpg-sign")
    return remote, str(repo.git.rev_parse("v9.9.0"))


def _pins_home(tmp_path: Path, remote: Path, commit: str) -> Path:
    home = tmp_path / "home"
    (home / "patches").mkdir(parents=True)
    pins = {
        "default": "vllm-9.9.0",
        "pins": {
            "vllm-9.9.0": {
                "version": "9.9.0",
                "upstream": {"remote": str(remote), "commit": commit},
                "sdist": {"file": "vllm-9.9.0.tar.gz", "sha256": "0" * 64},
                "torch": "2.11.0", "cuda": "13.0", "flashinfer": "0.6.8.post1",
            }
        },
    }
    (home / "patches" / "pins.yaml").write_text(yaml_text(pins))
    return home


@pytest.fixture()
def git_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    for k, v in {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                 "GIT_COMMITTER_EMAIL": "t@t"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    return _make_upstream(tmp_path)


@pytest.mark.parametrize("short", [True, False])
def test_git_route_verifies_commit_prefix(tmp_path: Path, git_env: tuple[Path, str], short: bool) -> None:
    remote, sha = git_env
    home = _pins_home(tmp_path, remote, sha[:9] if short else sha)
    pin = load_pins(home / "patches" / "pins.yaml").get(None)
    got = fetch_source(pin, "git")
    assert got.verified == f"commit:{sha}"
    assert git.Repo(got.path).head.commit.hexsha == sha
    assert (got.path / "README.md").read_text() == "two\n"
    assert fetch_source(pin, "git").cached
    # a mirror URL given explicitly works the same
    other = fetch_source(pin, "git", dest=tmp_path / "second", remote=f"file://{remote}")
    assert other.verified == f"commit:{sha}"


def test_git_route_refuses_a_commit_the_remote_lacks(tmp_path: Path, git_env: tuple[Path, str]) -> None:
    remote, _ = git_env
    home = _pins_home(tmp_path, remote, "deadbeef1")
    pin = load_pins(home / "patches" / "pins.yaml").get(None)
    with pytest.raises(SourceError, match="no commit starting with deadbeef1"):
        fetch_source(pin, "git", dest=tmp_path / "t")
    assert not (tmp_path / "t").exists() and not (tmp_path / "t.tmp").exists()


def test_path_route(tmp_path: Path, git_env: tuple[Path, str]) -> None:
    remote, sha = git_env
    home = _pins_home(tmp_path, remote, sha[:10])
    pin = load_pins(home / "patches" / "pins.yaml").get(None)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(remote), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", "v9.9.0"], cwd=clone, check=True)
    assert verify_tree(pin, clone) == f"commit:{sha}"
    got = fetch_source(pin, str(clone))
    assert (got.source, got.cached, got.path) == ("path", True, clone)
    with pytest.raises(UsageError, match="--dest has no effect"):
        fetch_source(pin, str(clone), dest=tmp_path / "elsewhere")
    with pytest.raises(UsageError, match="--remote is for --from git"):
        fetch_source(pin, str(clone), remote=str(remote))
    # a g4build series commit on top still is the pinned source, patched
    (clone / "README.md").write_text("patched\n")
    subprocess.run(["git", "commit", "-qam", "p\n\nG4build-Series: s v1\n"], cwd=clone, check=True)
    assert verify_tree(pin, clone) == f"commit:{sha} (+1 g4build series commit(s))"
    # an upstream commit past the pin is another source, even one commit later
    subprocess.run(["git", "checkout", "-q", "-"], cwd=clone, check=True)  # the branch: one commit past the tag
    with pytest.raises(SourceError, match=r"neither the pinned commit nor g4build series commits"):
        verify_tree(pin, clone)
    plain = tmp_path / "plain"
    (plain / "vllm").mkdir(parents=True)
    version_py = "__version__ = version = '9.9.0'\n__commit_id__ = commit_id = 'g1234567'\n"
    (plain / "vllm" / "_version.py").write_text(version_py)
    with pytest.raises(SourceError, match=r"expected version 9\.9\.0 at commit"):
        verify_tree(pin, plain)


@pytest.mark.network
def test_concurrent_source_fetches_make_one_good_tree(tmp_path: Path, sdist_archive: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "sdists").mkdir(parents=True)
    shutil.copy(sdist_archive, cache / "sdists" / sdist_archive.name)  # seeded: both runs race on the tree
    repo_root = Path(__file__).resolve().parents[3]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "G4BUILD_CACHE": str(cache),
           "PYTHONPATH": str(repo_root / "toolkit")}
    cmd = [sys.executable, "-m", "g4build", "source", "fetch", "--pin", PIN, "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    results = [json.loads(o[0]) for o in outs]
    assert sorted(r["cached"] for r in results) == [False, True]
    assert results[0]["path"] == results[1]["path"]
    tree = Path(results[0]["path"])
    assert [c.message.strip() for c in git.Repo(tree).iter_commits()] == ["upstream vllm 0.21.0"]
    assert sorted(p.name for p in tree.parent.iterdir()) == ["sdist", "sdist.lock"]
