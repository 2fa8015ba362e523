"""`g4build overlay` killed, interrupted, raced or aimed at planted links: --out holds a validated wheel and its
manifest or nothing new, and the next run removes what a killed one left. The real CLI runs in a subprocess;
G4BUILD_FAULT (g4build.util.faults) makes it signal itself at a chosen point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.wheelsfactory import build_wheel, run_g4build

import g4build

PIN = "vllm-0.21.0"
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="signals and flock: POSIX")


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder``: file bytes, link targets, folders, hidden ones included."""
    out: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        out[rel] = f"link:{os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return out


def staging(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith(".g4build-") and p.name.endswith(".part"))


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """An --out that already holds files of an earlier run, which an interrupted run must leave as they are."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "build-manifest.json").write_text('{"earlier": true}\n')
    (folder / "notes.txt").write_text("mine\n")
    return folder


@pytest.mark.parametrize("point", ["after-wheel-write", "before-publish"])
def test_killed_overlay_leaves_out_as_it_was_and_the_next_run_cleans_up(tmp_path: Path, project: Path, out: Path,
                                                                        point: str) -> None:
    src = build_wheel(tmp_path / "in")
    before = snapshot(out)
    killed = run_g4build("overlay", str(src), "--pin", PIN, "--out", str(out), env={"G4BUILD_FAULT": point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = staging(out)
    assert len(left) == 1 and any(left[0].glob("*.whl"))  # the kill landed with a finished wheel staged
    assert {k: v for k, v in snapshot(out).items() if not k.startswith(left[0].name)} == before

    done = run_g4build("overlay", str(src), "--pin", PIN, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert f"removed {left[0]}: left by an interrupted overlay" in done.stderr
    assert staging(out) == [] and len(list(out.glob("*.whl"))) == 1


def test_ctrl_c_prints_aborted_exits_130_and_leaves_out_byte_exact(tmp_path: Path, project: Path, out: Path) -> None:
    src = build_wheel(tmp_path / "in")
    before = snapshot(out)
    done = run_g4build("overlay", str(src), "--pin", PIN, "--out", str(out),
                       env={"G4BUILD_FAULT": "after-wheel-write:SIGINT"})
    assert done.returncode == 130 and done.stderr.strip().endswith("aborted"), done.stderr
    assert snapshot(out) == before


def test_a_running_overlays_staging_is_not_swept_by_a_second_one(tmp_path: Path, project: Path, out: Path) -> None:
    src = build_wheel(tmp_path / "in")
    toolkit = str(Path(g4build.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": toolkit, "G4BUILD_FAULT": "after-wheel-write:SIGSTOP"}
    first = subprocess.Popen([sys.executable, "-m", "g4build", "overlay", str(src), "--pin", PIN, "--out", str(out)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, status = os.waitpid(first.pid, os.WUNTRACED)  # returns once it stopped itself, its wheel staged
        assert os.WIFSTOPPED(status)
        (live,) = staging(out)
        second = run_g4build("overlay", str(src), "--pin", PIN, "--out", str(out))
        assert second.returncode == 0, second.stderr
        assert f"left {live} in place: another overlay may be using it" in second.stderr
        assert staging(out) == [live]
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert first.wait() == 0, first.stderr.read().decode() if first.stderr else ""
    assert staging(out) == [] and len(list(out.glob("*.whl"))) == 1


def test_planted_links_in_out_are_never_written_through(tmp_path: Path, project: Path, out: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("outside --out\n")
    for name in ("build-manifest.json.part", ".build-manifest.json.part", "build-manifest.json"):
        (out / name).unlink(missing_ok=True)
        (out / name).symlink_to(victim)
    done = run_g4build("overlay", str(build_wheel(tmp_path / "in")), "--pin", PIN, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "outside --out\n"
    assert not (out / "build-manifest.json").is_symlink() and b'"digest"' in (out / "build-manifest.json").read_bytes()
