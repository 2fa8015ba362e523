"""`g4build --help` as a new user reads it: the commands they run first, before the build's own steps; flags
without a `<bool>` beside them; and the quickstart's output folder ignored by git."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def g4build_help(*words: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "COLUMNS": "200", "TERM": "dumb"}
    done = subprocess.run([sys.executable, "-m", "g4build", *words, "--help"], capture_output=True, text=True,
                          env=env, check=True, cwd=REPO)
    return done.stdout


def test_the_user_commands_come_first_then_the_build_steps() -> None:
    text = g4build_help()
    first = [text.index(f"│ {name} ") for name in ("doctor", "overlay", "recipe", "wheel", "validate")]
    internal = [text.index(f"│ {name} ") for name in ("source", "patches", "deps", "prefetch", "cuda-shim",
                                                         "flashinfer-wheels", "manifest", "ci", "image")]
    assert first == sorted(first) and max(first) < min(internal)
    assert max(first) < text.index("Build steps and maintenance") < min(internal)


@pytest.mark.parametrize("words", [(), ("wheel",), ("recipe", "render"), ("overlay",), ("doctor",)])
def test_flags_show_no_bool_placeholder(words: tuple[str, ...]) -> None:
    text = g4build_help(*words)
    assert "<bool>" not in text
    assert "--help" in text


def test_options_that_take_a_value_keep_their_type() -> None:
    assert "<dir>" in g4build_help()  # --project DIR
    assert "<path>" in g4build_help("recipe", "render")  # --wheel PATH


def test_the_quickstarts_launch_folder_is_ignored() -> None:
    done = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "launch/gemma4-26b-a4b-nvfp4-dflash.sh"],
                          check=False)
    assert done.returncode == 0  # README's bash block writes its script there (dist/ is ignored too)
