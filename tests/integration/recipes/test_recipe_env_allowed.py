"""A recipe's `env` holds only names vLLM, CUDA, NCCL, PyTorch and the launch read (recipes/vllm-args/launch-env.yaml):
BASH_ENV, LD_PRELOAD, PATH or PYTHONWARNINGS (with BROWSER) in a recipe file would run code when the rendered
script starts, so `recipe render` and `recipe check` refuse them (exit 11) and write no script. A name off the
allow-list is set only when the command line says --allow-env NAME, and the output names it; a name on the
deny-list stays refused even then. Real recipe files, the real CLI, the rendered script run by real bash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.integration.recipes.conftest import REPO, Stubs, g4build

RECIPE = "gemma4-26b-a4b-nvfp4-baseline"
HOSTILE = {
    "BASH_ENV": {"BASH_ENV": "{dir}/payload.sh"},
    "LD_PRELOAD": {"LD_PRELOAD": "{dir}/payload.so"},
    "PATH": {"PATH": "{dir}/evil-bin:/usr/bin:/bin"},
    "PYTHONWARNINGS": {"PYTHONWARNINGS": "ignore::antigravity.x", "BROWSER": "touch {dir}/pwned"},
    "Path (any case)": {"Path": "{dir}/evil-bin"},
}


def _recipe(tmp_path: Path, env: dict[str, str]) -> Path:
    text = (REPO / "recipes" / f"{RECIPE}.yaml").read_text(encoding="utf-8")
    assert "\nenv:\n" in text
    lines = "".join(f"  {k}: '{v.format(dir=tmp_path)}'\n" for k, v in env.items())
    path = tmp_path / "recipes" / f"{RECIPE}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace("\nenv:\n", f"\nenv:\n{lines}", 1), encoding="utf-8")
    return path


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("shell", ["bash", "powershell"])
def test_code_running_names_in_a_recipe_file_are_refused(tmp_path: Path, case: str, shell: str) -> None:
    path = _recipe(tmp_path, HOSTILE[case])
    out = tmp_path / "out"
    rendered = g4build("recipe", "render", str(path), "--shell", shell, "--out", str(out))
    assert rendered.returncode == 11, rendered.stderr
    name = next(iter(HOSTILE[case]))
    # refused as denied (so --allow-env cannot open it), not merely as a name off the allow-list
    denied = f"env {name}: refused: a launch script never sets it"
    assert denied in rendered.stderr and "unexpected" not in rendered.stderr, rendered.stderr
    assert not out.exists()  # no script at all
    checked = g4build("recipe", "check", str(path))
    assert checked.returncode == 11 and f"[env-allowed] {denied}" in checked.stdout, checked.stdout
    assert f"env {name}: refused: not a name" not in checked.stdout, checked.stdout


def test_allow_env_does_not_open_the_deny_list(tmp_path: Path) -> None:
    path = _recipe(tmp_path, HOSTILE["BASH_ENV"])
    result = g4build("recipe", "render", str(path), "--shell", "bash", "--allow-env", "BASH_ENV")
    assert result.returncode == 11 and "even with --allow-env" in result.stderr, result.stderr
    result = g4build("recipe", "render", RECIPE, "--shell", "bash", "--set", "env.LD_PRELOAD=/x.so",
                     "--allow-env", "LD_PRELOAD")
    assert result.returncode == 11 and "env LD_PRELOAD: refused" in result.stderr


def test_a_name_off_the_list_is_set_only_on_allow_env_and_named(tmp_path: Path, stubs: Stubs) -> None:
    path = _recipe(tmp_path, {"MY_SITE_TAG": "rack-7"})
    refused = g4build("recipe", "render", str(path), "--shell", "bash")
    assert refused.returncode == 11 and "--allow-env MY_SITE_TAG" in refused.stderr
    out = tmp_path / "out"
    allowed = g4build("recipe", "render", str(path), "--shell", "bash", "--out", str(out),
                      "--allow-env", "MY_SITE_TAG")
    assert allowed.returncode == 0, allowed.stderr
    assert "env MY_SITE_TAG: set because the command line said --allow-env MY_SITE_TAG" in allowed.stderr
    run = stubs.run(out / f"{RECIPE}.sh")
    assert run.returncode == 0, run.stderr
    (vllm,) = [c for c in stubs.calls() if c["prog"] == "vllm"]
    assert vllm["env"]["MY_SITE_TAG"] == "rack-7"
    checked = g4build("recipe", "check", str(path), "--allow-env", "MY_SITE_TAG")
    assert checked.returncode == 0 and "--allow-env MY_SITE_TAG" in checked.stdout, checked.stdout


def test_the_shipped_recipes_set_only_allowed_names(tmp_path: Path, stubs: Stubs) -> None:
    recipes = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))
    assert len(recipes) >= 5
    for recipe in recipes:
        result = g4build("recipe", "check", recipe, "--json")
        # exit 0 and the report of this recipe: a crash with empty output would otherwise pass
        assert result.returncode == 0, (recipe, result.stdout, result.stderr)
        report = json.loads(result.stdout)
        assert report["recipe"] == recipe and report["ok"] is True, report
        assert not [f for f in report["findings"] if f["rule"] == "env-allowed"], report


def test_an_allowed_name_renders_and_runs(tmp_path: Path, stubs: Stubs) -> None:
    path = _recipe(tmp_path, {"NCCL_DEBUG": "INFO", "CUDA_LAUNCH_BLOCKING": "1"})
    out = tmp_path / "out"
    result = g4build("recipe", "render", str(path), "--shell", "bash", "--out", str(out))
    assert result.returncode == 0 and "env-allowed" not in result.stderr, result.stderr
    assert stubs.run(out / f"{RECIPE}.sh").returncode == 0
    (vllm,) = [c for c in stubs.calls() if c["prog"] == "vllm"]
    assert vllm["env"]["NCCL_DEBUG"] == "INFO" and vllm["env"]["CUDA_LAUNCH_BLOCKING"] == "1"
