"""Usage mistakes end in click's one-line error plus usage and exit 2, never a traceback, whatever copy of
click the installed typer parses with (typer >= 0.20 carries its own and installs none)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import g4build.cli as cli


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script (pip install . / -e . puts it beside this interpreter)."""
    script = Path(sys.executable).with_name("g4build")
    exe = str(script) if script.is_file() else shutil.which("g4build")
    if exe is None:
        pytest.fail("no g4build console script: install the project (README's test set-up) first")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["wheeel"], "No such command 'wheeel'"),
        (["pins", "show"], "Missing argument"),
        (["wheel", "--os", "wsl", "--dry-run"], "Missing option '--arch'"),
        (["wheel", "--arch", "sm120", "--os", "wsl", "--jobs", "0", "--dry-run"], "--jobs"),
    ],
)
def test_usage_errors_exit_2_without_traceback(args: list[str], needle: str) -> None:
    proc = _run(*args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert needle in proc.stderr
    assert "Usage: g4build" in proc.stderr


def test_short_help_and_version() -> None:
    assert "Usage: g4build" in _run("-h").stdout
    version = _run("-V")
    assert version.returncode == 0 and version.stdout.startswith("g4build ")


def test_unexpected_exception_is_one_line_exit_1(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def broken(**_: object) -> None:
        raise RuntimeError("boom [red]not markup[/red]")

    monkeypatch.delenv("G4BUILD_DEBUG", raising=False)
    monkeypatch.setattr(cli, "app", broken)
    with pytest.raises(SystemExit) as exc:
        cli.main(["pins", "list"])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "unexpected RuntimeError: boom [red]not markup[/red]" in err
    assert "G4BUILD_DEBUG=1" in err and "Traceback" not in err


def test_debug_env_keeps_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setenv("G4BUILD_DEBUG", "1")
    monkeypatch.setattr(cli, "app", broken)
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["pins", "list"])


@pytest.mark.parametrize(
    ("args", "code"),
    [(["pins", "show", "nosuch", "--json"], 2), (["validate", "/nonexistent.whl", "--json"], 5)],
)
def test_json_errors_are_an_object_on_stdout(args: list[str], code: int) -> None:
    import json

    proc = _run(*args)
    assert proc.returncode == code
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == code and doc["error"] and "hint" in doc
    assert "Traceback" not in proc.stderr and proc.stderr.strip()  # the message still goes to stderr


def test_os_names_are_case_insensitive_like_arch() -> None:
    upper = _run("wheel", "--arch", "SM120", "--os", "Windows", "--dry-run", "--json")
    lower = _run("wheel", "--arch", "sm120", "--os", "windows", "--dry-run", "--json")
    assert upper.returncode == lower.returncode == 0, upper.stderr
    assert upper.stdout == lower.stdout


def test_json_error_after_an_earlier_command_in_the_same_process(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    cli.main(["pins", "list", "--json"])  # succeeds: returns
    assert json.loads(capsys.readouterr().out)
    with pytest.raises(SystemExit) as second:
        cli.main(["pins", "show", "nosuch", "--json"])
    assert second.value.code == 2
    assert json.loads(capsys.readouterr().out)["exit_code"] == 2


def test_ctrl_c_in_any_command_says_aborted_and_exits_130(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A real SIGINT while a command runs: typer turns the KeyboardInterrupt into a silent Exit(130), and main()
    must still say what happened (the overlay's own handling is not the only place that does)."""
    import os
    import signal
    import time

    import g4build.cli.pins as pins_cli

    def interrupted() -> None:
        os.kill(os.getpid(), signal.SIGINT)  # delivered to this (main) thread: KeyboardInterrupt below
        time.sleep(10)
        raise AssertionError("SIGINT was not delivered")

    monkeypatch.setattr(pins_cli, "load_pins", interrupted)
    # a test run started as a background job inherits SIGINT ignored (the shell's doing): this test sends the
    # signal, so it sets the disposition Python gives an interactive process itself, and puts the old one back
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["pins", "list"])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert exit_info.value.code == 130
    assert "aborted" in capsys.readouterr().err
