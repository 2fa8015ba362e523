"""Hostile names and values in recipes and --set: a trailing newline, NUL, control characters, lone surrogates.

Each would otherwise pass a ``re.match(...$)`` name check or reach the renderer and produce a broken script line
(or crash the UTF-8 write); they are refused with the key named.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from g4build.errors import ConfigError, UsageError
from g4build.recipes import load_recipe, render
from g4build.recipes.overrides import parse_override
from g4build.util.shellquote import windows_word

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("item", ["env.FOO\n=val", "env.FOO\r=val", "args.max-model-len\n=5"])
def test_set_key_with_trailing_line_break_is_refused(item: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_override(item)
    assert repr(item.partition("=")[0].split(".")[1]) in info.value.message


@pytest.mark.parametrize(("item", "what"), [
    ("env.X=a\x00b", "NUL"),
    ("model=./m\udcff", "lone surrogate U+DCFF"),  # an undecodable byte on the command line
    ("notes=bell\x07", "U+0007"),
    ("env.X\x1b=1", "U+001B"),
])
def test_set_value_or_key_that_is_not_clean_text_is_refused(item: str, what: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_override(item)
    assert what in info.value.message
    assert info.value.message.startswith(f"--set {item.partition('=')[0]!r}")


def test_set_surrogate_never_reaches_render(write_recipe: Any, base_data: dict[str, Any]) -> None:
    path = write_recipe(base_data)
    with pytest.raises(UsageError, match=r"env\.VLLM_X"):
        load_recipe(str(path), ["env.VLLM_X=\ud800"])
    # the same recipe without the bad value renders and encodes as UTF-8
    render(load_recipe(str(path), ["env.VLLM_X=ok"]), "bash").encode("utf-8")


def _write_text(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(body, encoding="utf-8")
    return path


_RECIPE = """\
name: {name}
model: ./models/target
hardware: {{vram_gb: 32, arch: sm120}}
{extra}
"""


def test_recipe_env_name_with_trailing_newline_is_refused(tmp_path: Path) -> None:
    # YAML's double-quoted "FOO\\n" is the key FOO plus a line feed.
    path = _write_text(tmp_path, "nl", _RECIPE.format(name="nl", extra='env:\n  "FOO\\n": "1"'))
    with pytest.raises(ConfigError) as info:
        load_recipe(str(path))
    assert str(path) in info.value.message and ".env" in info.value.message and "'FOO\\n'" in info.value.message


@pytest.mark.parametrize(("extra", "key", "what"), [
    ('env:\n  VLLM_X: "a\\ud800"', "env.VLLM_X", "lone surrogate U+D800"),
    ('notes: "x\\0y"', "notes", "NUL"),
    ('args:\n  served-x: "a\\x1bb"', "args.served-x", "U+001B"),
])
def test_recipe_value_that_is_not_clean_text_names_file_and_key(
        tmp_path: Path, extra: str, key: str, what: str) -> None:
    path = _write_text(tmp_path, "bad", _RECIPE.format(name="bad", extra=extra))
    with pytest.raises(ConfigError) as info:
        load_recipe(str(path))
    message = info.value.message
    assert str(path) in message and key in message and what in message


def test_recipe_option_and_arch_need_a_full_match(write_recipe: Any, base_data: dict[str, Any]) -> None:
    base_data["args"] = {"max-model-len\n": 5}
    with pytest.raises(ConfigError, match="is not an option name"):
        load_recipe(str(write_recipe(base_data)))
    base_data["args"] = {}
    base_data["hardware"]["arch"] = "sm120\n"
    with pytest.raises(ConfigError, match=r"hardware\.arch"):
        load_recipe(str(write_recipe(base_data)))


def test_windows_word_quotes_a_value_ending_in_a_line_break() -> None:
    # Left bare, the pre-quoted list for PowerShell 5.1 would carry the raw line break.
    assert windows_word("abc\n") == '"abc\n"'
    assert windows_word("abc") == "abc"


def test_cli_render_refuses_env_name_with_newline_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "g4build", "recipe", "render", "gemma4-26b-a4b-nvfp4-dflash", "--shell", "bash",
         "--out", str(out), "--set", "env.FOO\n=val"],
        capture_output=True, text=True, encoding="utf-8", env=env, check=False)
    assert result.returncode == UsageError.exit_code, result.stdout + result.stderr
    assert "not an environment variable name" in result.stdout + result.stderr
    assert not out.exists() or not any(out.iterdir())
