"""Piped output is plain and whole, as pip and uv print it: no boxes, nothing cut to 80 columns, no trailing
blanks. The real console script writes into a pipe here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BOX = set("┏┓┗┛━┃│─┡┩╇┼┳┻")


def _piped(*args: str) -> str:
    script = Path(sys.executable).with_name("g4build")
    proc = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80", "TERM": "xterm"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_pins_list_keeps_names_whole() -> None:
    out = _piped("pins", "list")
    assert "vllm-0.21.0 (default)" in out and "vllm-0.33.0" in out
    assert not BOX & set(out)
    assert all(line == line.rstrip() for line in out.splitlines())


def test_patches_list_one_row_per_series_line() -> None:
    out = _piped("patches", "list")
    rows = [line for line in out.splitlines() if "gemma4-backend-decoupling" in line]
    assert len(rows) == 1
    assert "An independent-KV drafter chooses its own attention backend" in rows[0]
    assert max(len(line) for line in out.splitlines()) > 80  # nothing was wrapped to the default width


def test_commands_run_without_git_on_path() -> None:
    """GitPython refuses to import without git; doctor must still run and report it."""
    script = Path(sys.executable).with_name("g4build")
    proc = subprocess.run([str(script), "pins", "list"], capture_output=True, text=True, timeout=120,
                          env={"PATH": str(script.parent), "HOME": os.environ.get("HOME", "/")})
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr


def test_plain_option_on_a_terminal() -> None:
    """On a terminal (rich forced to one by FORCE_COLOR) tables are boxed; --plain prints them as a pipe gets them."""
    script = Path(sys.executable).with_name("g4build")
    env = {**os.environ, "COLUMNS": "80", "TERM": "xterm", "FORCE_COLOR": "1"}
    env.pop("G4BUILD_PLAIN", None)
    boxed = subprocess.run([str(script), "pins", "list"], capture_output=True, text=True, timeout=120, env=env)
    plain = subprocess.run([str(script), "--plain", "pins", "list"], capture_output=True, text=True, timeout=120,
                           env={**env, "NO_COLOR": "1"})
    assert boxed.returncode == 0 and plain.returncode == 0, (boxed.stderr, plain.stderr)
    assert BOX & set(boxed.stdout)
    assert not BOX & set(plain.stdout) and "vllm-0.21.0 (default)" in plain.stdout
    assert "\x1b[" not in plain.stdout  # NO_COLOR: no escape codes at all
