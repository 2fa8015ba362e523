"""Output paths a new user gets wrong (a file on the way, a folder where a file goes, a folder that cannot be
written, a venv that is not there) are usage errors: exit 2, the path, what was expected, what to do; nothing is
written and no "unexpected OSError ... report it". The real CLI runs in this process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from g4build.cli import main
from g4build.cli.outpaths import output_file, output_folder
from g4build.errors import UsageError

RECIPE = "gemma4-26b-a4b-nvfp4-baseline"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def _commands(tmp: Path, where: str) -> dict[str, list[str]]:
    return {
        "recipe render --out": ["recipe", "render", RECIPE, "--shell", "bash", "--out", where],
        "wheel --emit-script": ["wheel", "--arch", "sm120", "--os", "linux", "--pin", "vllm-0.21.0",
                                "--emit-script", where],
        "ci resolve --github-output": ["ci", "resolve", "--pin", "vllm-0.21.0", "--github-output", where],
        "source fetch --dest": ["source", "fetch", "--pin", "vllm-0.21.0", "--dest", where],
        "image extract --out": ["image", "extract", str(tmp / "missing.tar"), "--pin", "vllm-0.21.0", "--out", where],
        "overlay --out": ["overlay", str(tmp / "junk.whl"), "--pin", "vllm-0.21.0", "--out", where],
        "cuda-shim --dest": ["cuda-shim", "--dest", where],
        "flashinfer-wheels --out": ["flashinfer-wheels", "--pin", "vllm-0.21.0", "--out", where, "--wheel",
                                    f"{tmp / 'flashinfer_python-0.6.8.post1-py3-none-any.whl'}={'0' * 64}"],
        "deps apply --write": ["deps", "apply", "--tree", str(tmp), "--write", where],
        "prefetch --write": ["prefetch", "--tree", str(tmp), "--write", where],
    }


FILE_VALUED = ("wheel --emit-script", "ci resolve --github-output", "deps apply --write", "prefetch --write")


@pytest.mark.parametrize("command", sorted(_commands(Path("/x"), "")))
@pytest.mark.parametrize("shape", ["a file on the way", "a file where a folder goes"])
def test_a_file_in_the_way_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str,
                                             shape: str) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("keep\n")
    (tmp_path / "junk.whl").write_bytes(b"not a zip: the output path is checked before the wheel is read")
    where = blocker / "sub" / "x" if shape == "a file on the way" else blocker
    if command in FILE_VALUED and shape != "a file on the way":
        where = blocker / "plan.sh"  # a file-valued option: its folder is the file
    args = _commands(tmp_path, str(where))[command]
    code, err = _run(capsys, *args)
    assert code == 2, err
    assert str(blocker) in err and "unexpected" not in err.lower()
    assert blocker.read_text() == "keep\n"


@pytest.mark.parametrize("command", FILE_VALUED)
def test_a_folder_where_a_file_goes_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      command: str) -> None:
    code, err = _run(capsys, *_commands(tmp_path, str(tmp_path))[command])
    assert code == 2, err
    assert "expected a file name, found a folder" in err


def test_overlay_venv_that_is_not_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, "overlay", "--venv", str(tmp_path / "nope"), "--pin", "vllm-0.21.0")
    assert code == 2, err
    assert "expected a virtual environment" in err and "found nothing there" in err
    code, err = _run(capsys, "overlay", "--venv", str(tmp_path / "nope"), "--undo")
    assert code == 2, err


def test_a_missing_parent_is_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing there yet is fine: the folders are made (the checks refuse only what cannot work)."""
    code, err = _run(capsys, *_commands(tmp_path, str(tmp_path / "new" / "deeper"))["recipe render --out"])
    assert code == 0, err
    assert (tmp_path / "new" / "deeper" / f"{RECIPE}.sh").is_file()
    out = tmp_path / "gh" / "out"
    code, err = _run(capsys, *_commands(tmp_path, str(out))["ci resolve --github-output"])
    assert code == 0, err
    assert out.read_text(encoding="utf-8").startswith("release<<")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="permission bits bind: POSIX, not root")
def test_a_read_only_folder_is_a_usage_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(UsageError, match="not writable"):
            output_folder(ro / "x", "--out")
        with pytest.raises(UsageError, match="not writable"):
            output_file(ro / "x.sh", "--emit-script")
    finally:
        ro.chmod(0o755)


def test_a_dangling_link_on_the_way(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(UsageError, match="dangling link"):
        output_folder(tmp_path / "link" / "x", "--out")
