"""`g4build overlay --venv` as a transaction, on real venvs: kills at every stage (the real CLI in a subprocess
killing itself through G4BUILD_FAULT), two runs at once, a user's edit after the overlay, a symlinked file."""

from __future__ import annotations

import csv
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.wheelsfactory import DFLASH_NEW, PRISTINE, build_wheel, record_hash, run_g4build

from g4build.errors import LockTimeoutError, PatchConflictError, UnsafeArchiveError
from g4build.overlay.venvjournal import venv_lock

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="venv layout of Linux, SIGKILL")

PIN = "vllm-0.21.0"
# sorted journal order of the changes the `project` fixture's series make:
# dist-info/RECORD, dist-info/build-manifest.json, vllm/obsolete.py, vllm/spec/added.py, dflash.py, utils.py
FILES = 6


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Cache (where the venv locks live) and TMPDIR inside the test's folder; TMPDIR must stay empty."""
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    return tmpdir


def make_venv(tmp_path: Path, *, link: str | None = None, link_dir: str | None = None) -> tuple[Path, Path]:
    """A real venv with the small fake vLLM installed; ``link`` (a path in the package) is made a symlink to a
    copy outside the venv, the way a hand-linked development file looks; ``link_dir`` the same for a folder."""
    wheel = build_wheel(tmp_path / "in")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    if link is not None:
        outside = tmp_path / "shared" / Path(link).name
        outside.parent.mkdir()
        outside.write_bytes((site / link).read_bytes())
        (site / link).unlink()
        (site / link).symlink_to(outside)
    if link_dir is not None:
        link_folder(site / link_dir, tmp_path / "shared-dir" / Path(link_dir).name)
    return venv, site


def link_folder(folder: Path, outside: Path) -> None:
    """Move ``folder`` to ``outside`` and leave a symlink to it in its place."""
    outside.parent.mkdir(parents=True)
    folder.rename(outside)
    folder.symlink_to(outside, target_is_directory=True)


def tree_state(venv: Path) -> dict[str, tuple[object, ...]]:
    """Everything under the venv, byte-exact: each file's sha256, mode and mtime, each link's target."""
    out: dict[str, tuple[object, ...]] = {}
    for p in sorted(venv.rglob("*")):
        if "__pycache__" in p.parts:
            continue
        st = p.lstat()
        if p.is_symlink():
            out[str(p.relative_to(venv))] = ("link", os.readlink(p))
        elif p.is_dir():
            out[str(p.relative_to(venv))] = ("dir", st.st_mode)
        else:
            out[str(p.relative_to(venv))] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode,
                                             st.st_mtime_ns)
    return out


def assert_overlaid(site: Path) -> None:
    assert (site / "vllm/spec/dflash.py").read_text() == DFLASH_NEW
    assert "LIMIT = 16" in (site / "vllm/spec/utils.py").read_text()
    assert not (site / "vllm/obsolete.py").exists()
    (dist,) = site.glob("vllm-*.dist-info")
    for path, digest, size in csv.reader((dist / "RECORD").read_text().splitlines()):
        if digest:
            data = (site / path).read_bytes()
            assert (record_hash(data), str(len(data))) == (digest, size), path


def no_strays(venv: Path, tmpdir: Path) -> None:
    assert not list(venv.rglob("*.g4build-tmp"))
    assert list(tmpdir.iterdir()) == []  # no source copies in the temporary folder


def overlay(venv: Path, *extra: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"G4BUILD_FAULT": fault} if fault else None
    return run_g4build("overlay", "--venv", str(venv), "--pin", PIN, *extra, env=env)


def undo(venv: Path, *extra: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"G4BUILD_FAULT": fault} if fault else None
    return run_g4build("overlay", "--venv", str(venv), "--undo", *extra, env=env)


@pytest.mark.parametrize("point", ["venv-overlay-after-journal", "venv-overlay-after-file-1",
                                   "venv-overlay-after-file-3", f"venv-overlay-after-file-{FILES}"])
def test_overlay_killed_at_any_point_is_undone_exactly(
    tmp_path: Path, project: Path, _isolated: Path, point: str,
) -> None:
    venv, _ = make_venv(tmp_path)
    before = tree_state(venv)
    killed = overlay(venv, fault=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert tree_state(venv) != before  # the journal is there at least
    undone = undo(venv)
    assert undone.returncode == 0, undone.stderr
    assert tree_state(venv) == before
    no_strays(venv, _isolated)


def test_ctrl_c_mid_overlay_says_how_to_recover(tmp_path: Path, project: Path, _isolated: Path) -> None:
    """Ctrl-C half way: exit 130, "aborted", and the way out named (the journal lets --undo roll it back)."""
    venv, _ = make_venv(tmp_path)
    before = tree_state(venv)
    stopped = overlay(venv, fault="venv-overlay-after-file-2:SIGINT")
    assert stopped.returncode == 130, stopped.stderr
    assert "aborted" in stopped.stderr and "--undo" in stopped.stderr
    assert undo(venv).returncode == 0
    assert tree_state(venv) == before
    no_strays(venv, _isolated)


@pytest.mark.parametrize("point", ["venv-overlay-after-file-2", f"venv-overlay-after-file-{FILES}"])
def test_overlay_killed_then_run_again_rolls_back_and_overlays(
    tmp_path: Path, project: Path, _isolated: Path, point: str,
) -> None:
    venv, site = make_venv(tmp_path)
    before = tree_state(venv)
    assert overlay(venv, fault=point).returncode == -signal.SIGKILL
    again = overlay(venv)
    assert again.returncode == 0, again.stderr
    assert_overlaid(site)
    assert undo(venv).returncode == 0
    assert tree_state(venv) == before
    no_strays(venv, _isolated)


@pytest.mark.parametrize("point", ["venv-undo-after-file-2", "venv-undo-before-cleanup", "venv-undo-during-cleanup"])
def test_undo_killed_at_any_point_is_finished_by_the_next_undo(
    tmp_path: Path, project: Path, _isolated: Path, point: str,
) -> None:
    venv, site = make_venv(tmp_path)
    before = tree_state(venv)
    assert overlay(venv).returncode == 0
    killed = undo(venv, fault=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    again = undo(venv)
    if point == "venv-undo-during-cleanup":  # every file was back: only the stale folder is left to sweep
        assert again.returncode == 2 and "removed the state folder an interrupted run left behind" in again.stderr
    else:
        assert again.returncode == 0, again.stderr
    assert tree_state(venv) == before
    no_strays(venv, _isolated)
    assert overlay(venv).returncode == 0  # and the venv takes a new overlay
    assert_overlaid(site)


def test_a_second_overlay_waits_for_the_lock_and_refuses_clearly(tmp_path: Path, project: Path) -> None:
    venv, _ = make_venv(tmp_path)
    before = tree_state(venv)
    with venv_lock(venv):  # another run holds this venv
        blocked = run_g4build("overlay", "--venv", str(venv), "--pin", PIN, env={"G4BUILD_LOCK_TIMEOUT": "0.2"})
    assert blocked.returncode == LockTimeoutError.exit_code, blocked.stderr
    assert "held by another g4build run" in blocked.stderr
    assert tree_state(venv) == before


@pytest.mark.skipif(os.name == "nt", reason="the folder lock is POSIX's flock; Windows has the cache lock only")
def test_a_run_with_another_cache_meets_the_same_venv_lock(tmp_path: Path, project: Path) -> None:
    """Two runs on one venv must exclude each other whatever G4BUILD_CACHE each has (a lock kept only in the cache
    let an undo with another cache roll back a running overlay and delete its state)."""
    venv, _ = make_venv(tmp_path)
    before = tree_state(venv)
    with venv_lock(venv):  # held under this test's cache
        blocked = run_g4build("overlay", "--venv", str(venv), "--pin", PIN, "--undo",
                              env={"G4BUILD_LOCK_TIMEOUT": "0.3", "G4BUILD_CACHE": str(tmp_path / "other-cache")})
    assert blocked.returncode == LockTimeoutError.exit_code, blocked.stderr
    assert "held by another g4build run" in blocked.stderr
    assert tree_state(venv) == before


def test_two_overlays_at_once_leave_one_overlay_that_undoes_exactly(
    tmp_path: Path, project: Path, _isolated: Path,
) -> None:
    venv, site = make_venv(tmp_path)
    before = tree_state(venv)
    cmd = [sys.executable, "-m", "g4build", "overlay", "--venv", str(venv), "--pin", PIN]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[3] / "toolkit"),
                                                                       os.environ.get("PYTHONPATH")]))}
    runs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = sorted((p.wait(), p.communicate()[1]) for p in runs)
    assert [code for code, _ in results] == [0, 2], results
    assert "already carries a g4build overlay" in results[1][1]
    assert_overlaid(site)
    assert undo(venv).returncode == 0
    assert tree_state(venv) == before
    no_strays(venv, _isolated)


def test_undo_refuses_to_discard_a_users_edit_unless_forced(tmp_path: Path, project: Path) -> None:
    venv, site = make_venv(tmp_path)
    before = tree_state(venv)
    assert overlay(venv).returncode == 0
    edited = site / "vllm/spec/dflash.py"
    edited.write_text(edited.read_text() + "# my own fix\n")
    after_edit = tree_state(venv)
    refused = undo(venv)
    assert refused.returncode == PatchConflictError.exit_code, refused.stderr
    assert "vllm/spec/dflash.py" in refused.stderr and "--force" in refused.stderr
    assert tree_state(venv) == after_edit  # nothing restored, the edit and the overlay's state kept
    forced = undo(venv, "--force")
    assert forced.returncode == 0, forced.stderr
    assert tree_state(venv) == before


def test_undo_refuses_when_a_removed_file_came_back(tmp_path: Path, project: Path) -> None:
    venv, site = make_venv(tmp_path)
    assert overlay(venv).returncode == 0
    (site / "vllm/obsolete.py").write_text(PRISTINE["vllm/obsolete.py"])
    refused = undo(venv)
    assert refused.returncode == PatchConflictError.exit_code and "vllm/obsolete.py" in refused.stderr


def test_a_symlinked_file_comes_back_a_symlink(tmp_path: Path, project: Path, _isolated: Path) -> None:
    venv, site = make_venv(tmp_path, link="vllm/spec/utils.py")
    outside = tmp_path / "shared" / "utils.py"
    kept = outside.read_bytes()
    before = tree_state(venv)
    assert overlay(venv).returncode == 0
    assert_overlaid(site)
    assert outside.read_bytes() == kept  # the overlay replaced the link, never wrote through it
    assert undo(venv).returncode == 0
    assert (site / "vllm/spec/utils.py").is_symlink()
    assert tree_state(venv) == before and outside.read_bytes() == kept
    no_strays(venv, _isolated)


def test_force_without_undo_is_a_usage_error(tmp_path: Path, project: Path) -> None:
    venv, _ = make_venv(tmp_path)
    done = overlay(venv, "--force")
    assert done.returncode == 2 and "--force only applies to --undo" in done.stderr


def test_a_symlinked_folder_in_site_packages_is_refused_before_anything_changes(
    tmp_path: Path, project: Path, _isolated: Path
) -> None:
    """vllm/spec (where the series writes) links to a folder outside the venv: writing through it would patch
    files that are not this venv's."""
    venv, site = make_venv(tmp_path, link_dir="vllm/spec")
    outside = tmp_path / "shared-dir"
    before, outside_before = tree_state(venv), tree_state(outside)
    refused = overlay(venv)
    assert refused.returncode == UnsafeArchiveError.exit_code, refused.stderr
    assert f"{site / 'vllm/spec'} is a symlink" in " ".join(refused.stderr.split())
    assert tree_state(venv) == before and tree_state(outside) == outside_before
    assert not (venv / ".g4build-overlay").exists()
    no_strays(venv, _isolated)


def test_undo_refuses_to_restore_through_a_folder_linked_after_the_overlay(
    tmp_path: Path, project: Path, _isolated: Path
) -> None:
    venv, site = make_venv(tmp_path)
    before = tree_state(venv)
    assert overlay(venv).returncode == 0
    outside = tmp_path / "shared-dir" / "spec"
    link_folder(site / "vllm/spec", outside)
    outside_before = tree_state(outside.parent)
    refused = undo(venv)
    assert refused.returncode == UnsafeArchiveError.exit_code, refused.stderr
    assert tree_state(outside.parent) == outside_before  # nothing restored into the linked-to folder
    (site / "vllm/spec").unlink()
    outside.rename(site / "vllm/spec")
    assert undo(venv).returncode == 0
    assert tree_state(venv) == before
    no_strays(venv, _isolated)
