"""The `g4build recipe` commands as users run them, and render_for_wheel as `g4build wheel --recipes` calls it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.integration.recipes.conftest import REPO, Stubs, g4build, make_wheel

from g4build.emit.manifest import make_manifest
from g4build.errors import RecipeError
from g4build.pins.model import load_pins
from g4build.recipes import render_for_wheel, script_filename, write_script
from g4build.series.model import load_all


def test_list_json_names_every_recipe() -> None:
    result = g4build("recipe", "list", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["gemma4-26b-a4b-nvfp4-dflash"]["speculative"] == "dflash"
    assert rows["gemma4-26b-a4b-nvfp4-mtp"]["speculative"] == "mtp"
    assert rows["gemma4-26b-a4b-nvfp4-baseline"]["speculative"] is None
    assert rows["gemma4-26b-a4b-nvfp4-dflash"]["hardware"] == {"vram_gb": 32.0, "arch": "sm120"}
    table = g4build("recipe", "list")
    assert table.returncode == 0 and "gemma4-31b-dflash" in table.stdout


def test_list_table_prints_descriptions_as_text(tmp_path: Path) -> None:
    # A description is recipe text: brackets in it are not rich markup (they were dropped, or crashed the table).
    home = tmp_path / "home"
    shutil.copytree(REPO / "recipes", home / "recipes")
    shutil.copytree(REPO / "patches", home / "patches")
    recipe = home / "recipes" / "gemma4-31b-dflash.yaml"
    text = recipe.read_text(encoding="utf-8")
    recipe.write_text(text.replace("description: Gemma 4 31B", "description: Gemma 4 31B [experimental] [/x]", 1),
                      encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(home), "COLUMNS": "400"}
    table = subprocess.run([sys.executable, "-m", "g4build", "recipe", "list"], capture_output=True, text=True,
                           encoding="utf-8", env=env, check=False)
    assert table.returncode == 0, table.stderr
    assert "Gemma 4 31B [experimental] [/x]" in table.stdout


def test_show_json_gives_the_exact_argv() -> None:
    result = g4build("recipe", "show", "gemma4-26b-a4b-nvfp4-mtp", "--set", "args.max-model-len=4096", "--json")
    data = json.loads(result.stdout)
    assert data["argv"][:2] == ["vllm", "serve"]
    assert data["argv"][data["argv"].index("--max-model-len") + 1] == "4096"


def test_check_reads_the_model_and_drafter_dirs(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
        "text_config": {"num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"],
                        "num_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512, "sliding_window": 512},
    }), encoding="utf-8")
    (target / "model.safetensors").write_bytes(b"\0" * 4096)
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"model_type": "dflash", "head_dim": 128}), encoding="utf-8")
    result = g4build("recipe", "check", "gemma4-26b-a4b-nvfp4-dflash", "--model-dir", str(target),
                     "--draft-dir", str(drafter), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["ok"] is True
    assert data["model"]["quant_algo"] == "NVFP4" and data["model"]["global_head_dim"] == 512
    assert data["model"]["weights_bytes"] == 4096
    assert data["drafter"]["head_dim"] == 128
    assert all(f["severity"] != "error" for f in data["findings"])

    forced = g4build("recipe", "check", "gemma4-26b-a4b-nvfp4-dflash", "--model-dir", str(target),
                     "--set", "args.quantization=modelopt", "--json")
    assert forced.returncode == RecipeError.exit_code
    assert [f["rule"] for f in json.loads(forced.stdout)["findings"] if f["severity"] == "error"] == ["quantization"]


def test_check_text_output_and_exit_code() -> None:
    bad = g4build("recipe", "check", "gemma4-31b-dflash", "--set", "args.moe-backend=cutlass")
    assert bad.returncode == RecipeError.exit_code
    assert "[moe-backend]" in bad.stdout and "GELU_TANH" in bad.stdout


def test_render_to_stdout_and_refusals(tmp_path: Path) -> None:
    ok = g4build("recipe", "render", "gemma4-26b-a4b-nvfp4-baseline", "--shell", "bash")
    assert ok.returncode == 0 and ok.stdout.startswith("#!/usr/bin/env bash\n")
    assert g4build("recipe", "render", "gemma4-26b-a4b-nvfp4-baseline", "--shell", "zsh").returncode == 2
    refused = g4build("recipe", "render", "gemma4-26b-a4b-nvfp4-dflash", "--shell", "powershell",
                      "--out", str(tmp_path), "--set", "speculative.attention_backend=triton_attn")
    assert refused.returncode == RecipeError.exit_code
    assert "flash_attn" in refused.stderr
    assert list(tmp_path.iterdir()) == []
    unknown = g4build("recipe", "render", "gemma4-26b-a4b-nvfp4-dflash", "--shell", "bash", "--set", "colour=red")
    assert unknown.returncode == 2 and "unknown recipe field 'colour'" in unknown.stderr


@pytest.fixture
def home_with_series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A G4BUILD_HOME whose patches/ holds the two series the DFlash recipes need, with 0.21.0 patches."""
    home = tmp_path / "home"
    shutil.copytree(REPO / "recipes", home / "recipes")
    (home / "patches").mkdir(parents=True)
    shutil.copy(REPO / "patches" / "pins.yaml", home / "patches" / "pins.yaml")
    names = ["gemma4-backend-decoupling", "dflash-batched-verification"]
    (home / "patches" / "series.yaml").write_text("order: [" + ", ".join(names) + "]\n", encoding="utf-8")
    for name in names:
        folder = home / "patches" / name / "vllm-0.21.0"
        folder.mkdir(parents=True)
        (folder / "0001-fix.patch").write_text("--- a/x\n+++ b/x\n", encoding="utf-8")
        (folder.parent / "series.yaml").write_text(
            f"name: {name}\nversion: 1\ntitle: t\npython_only: true\npins:\n  vllm-0.21.0:\n"
            "    patches:\n      - {file: vllm-0.21.0/0001-fix.patch, subject: fix}\n", encoding="utf-8")
    monkeypatch.setenv("G4BUILD_HOME", str(home))
    return home


def test_render_for_wheel_installs_the_wheel_beside_it(home_with_series: Path, tmp_path: Path, stubs: Stubs) -> None:
    pin = load_pins().get("vllm-0.21.0")
    manifest = make_manifest(pin, load_all(), route="build")
    dist = tmp_path / "dist"
    wheel = make_wheel(dist / "vllm-0.21.0+cu130.g4.abcdef0123-cp38-abi3-linux_x86_64.whl", manifest)
    name = "gemma4-26b-a4b-nvfp4-dflash"
    for shell in ("bash", "powershell"):
        text = render_for_wheel(name, shell, wheel)
        write_script(text, dist / script_filename(name, shell), shell)
    ps1 = (dist / f"{name}.ps1").read_text(encoding="utf-8-sig")
    assert "Join-Path -Path $PSScriptRoot -ChildPath 'vllm-0.21.0+cu130.g4.abcdef0123" in ps1
    result = stubs.run(dist / f"{name}.sh")
    assert result.returncode == 0, result.stderr
    # is this build installed (no), pip, the pin's environment, then the FlashInfer check
    assert stubs.programs() == ["nvidia-smi", "python3", "python3", "python3", "python3", "vllm"]
    [pip] = [c for c in stubs.calls() if c["prog"] == "python3" and c["argv"][0] == "-m"]
    assert pip["argv"] == ["-m", "pip", "install", str(wheel)]


def test_render_for_wheel_refuses_a_wheel_without_the_series(home_with_series: Path, tmp_path: Path) -> None:
    stock = make_wheel(tmp_path / "vllm-0.21.0-cp38-abi3-manylinux_2_24_x86_64.whl")
    with pytest.raises(RecipeError, match="does not carry series 'gemma4-backend-decoupling'"):
        render_for_wheel("gemma4-26b-a4b-nvfp4-dflash", "bash", stock)
    # A recipe that needs no series is fine with a stock wheel.
    assert "pip install" in render_for_wheel("gemma4-26b-a4b-nvfp4-baseline", "bash", stock)
