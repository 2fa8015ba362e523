"""recipes/vllm-args/launch-env.yaml as data: a pin's own additions allow a name for that pin only; a project without
the file allows no name (fails closed); a malformed file is a clear error. A copy of the project's data, named with
--project, read by the real CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from g4build.cli import main
from g4build.recipes.env_policy import POLICY_FILE

REPO = Path(__file__).resolve().parents[3]
RECIPE = "gemma4-26b-a4b-nvfp4-baseline"


def _project(tmp_path: Path) -> Path:
    top = tmp_path / "project"
    shutil.copytree(REPO / "patches", top / "patches")
    shutil.copytree(REPO / "recipes", top / "recipes")
    return top


def _check(top: Path, capsys: pytest.CaptureFixture[str], *sets: str) -> tuple[int, str]:
    argv = ["--project", str(top), "recipe", "check", RECIPE]
    for item in sets:
        argv += ["--set", item]
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_pins_own_names_are_allowed_for_that_pin_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    top = _project(tmp_path)
    policy = top / "recipes" / POLICY_FILE
    text = policy.read_text(encoding="utf-8")
    assert "\npins: {}\n" in text
    policy.write_text(text.replace("\npins: {}\n", "\npins:\n  vllm-0.21.0: {names: [MY_PIN_VAR]}\n"),
                      encoding="utf-8")
    code, out = _check(top, capsys, "env.MY_PIN_VAR=1")
    assert code == 0 and "env-allowed" not in out, out
    code, out = _check(top, capsys, "env.MY_PIN_VAR=1", "pin=vllm-0.33.0")
    assert code == 11 and "env MY_PIN_VAR: refused" in out, out


def test_a_project_without_the_file_allows_no_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    top = _project(tmp_path)
    (top / "recipes" / POLICY_FILE).unlink()
    code, out = _check(top, capsys)
    assert code == 11 and "env VLLM_ALLOW_LONG_MAX_MODEL_LEN: refused" in out and "absent" in out, out


def test_a_malformed_policy_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    top = _project(tmp_path)
    (top / "recipes" / POLICY_FILE).write_text("allow:\n  prefixes: [VLLM_, 'not a name']\n", encoding="utf-8")
    code, out = _check(top, capsys)
    assert code == 3 and "allow.prefixes" in out, out
