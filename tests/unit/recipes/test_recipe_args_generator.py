"""The argument-table generator offline, on a real tree: tests/fixtures/vllm_args_tree (the shape of a vLLM sdist's
argument files, written for the tests) packed as a pin's sdist, read by `table_from_sdist` as `pins add` reads a
pin's. Its choices (Literal aliases nested in aliases, a union with `str` left open, the lower-underscore
conversion vLLM puts on --moe-backend), its integer rules, then the table recorded into a copy of the project and
used by the real `recipe check`. The network tests hold the same generator to the pins' own sdists."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from g4build.pins.model import load_pins
from g4build.recipes.vllm_args import table_from_sdist

REPO = Path(__file__).resolve().parents[3]
TREE = REPO / "tests" / "fixtures" / "vllm_args_tree"
PIN = "vllm-0.21.0"


def _sdist(tmp_path: Path) -> Path:
    archive = tmp_path / "vllm-9.9.9.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(TREE / "vllm", arcname="vllm-9.9.9/vllm")
    return archive


@pytest.fixture
def table(tmp_path: Path) -> dict[str, Any]:
    return table_from_sdist(load_pins().get(PIN), _sdist(tmp_path))


def test_choices_come_from_literal_aliases_and_carry_vllms_conversion(table: dict[str, Any]) -> None:
    args = table["args"]
    assert args["moe-backend"]["choices"] == ["auto", "flashinfer_cutedsl", "flashinfer_cutlass", "marlin", "triton"]
    assert args["moe-backend"]["convert"] == "lower-underscore"
    assert args["uvicorn-log-level"] == {"bool": False, "choices": ["debug", "info", "warning"]}  # no conversion
    assert "choices" not in args["dtype"]  # `ModelDType | str`: vLLM takes any text there
    assert "choices" not in args["kv-dtype"]  # typed `str` on EngineArgs, whatever the config says
    assert args["max-model-len"]["int"] is True and args["max-model-len"]["gt"] == 0  # the config field's bound
    assert args["max-num-seqs"] == {"bool": False, "int": True, "ge": 1}  # a count: at least 1
    assert args["enforce-eager"]["bool"] is True and args["headless"] == {"bool": False}
    assert args["enable-log-requests"]["bool"] is True  # AsyncEngineArgs' own
    assert table["speculative"]["num_speculative_tokens"]["int"] is True
    assert table["pin"] == PIN and table["sdist_sha256"] == load_pins().get(PIN).sdist.sha256.lower()


def test_the_generated_table_decides_recipe_check(tmp_path: Path, table: dict[str, Any]) -> None:
    """Recorded as the pin's table in a copy of the project, the generated choices are what `--set` is held to,
    folded as vLLM folds them."""
    top = tmp_path / "project"
    shutil.copytree(REPO / "patches", top / "patches")
    shutil.copytree(REPO / "recipes", top / "recipes")
    (top / "recipes" / "vllm-args" / f"{PIN}.json").write_text(json.dumps(table), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(top), "COLUMNS": "300"}

    def check(*sets: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "g4build", "recipe", "check", "gemma4-26b-a4b-nvfp4-baseline"]
        for item in sets:
            argv += ["--set", item]
        return subprocess.run(argv, capture_output=True, text=True, encoding="utf-8", env=env, cwd=top,
                              timeout=300, check=False)

    assert check("args.moe-backend=Marlin").returncode == 0
    refused = check("args.moe-backend=deep_gemm")  # a real 0.21.0 choice, but not this tree's
    assert refused.returncode == 2, refused.stderr
    assert "expected one of auto, flashinfer_cutedsl, flashinfer_cutlass, marlin, triton" in refused.stderr
    folded = check("args.moe-backend=FlashInfer-CuteDSL")  # a choice once folded, and one Gemma 4 cannot run
    assert folded.returncode == 11 and "expected one of" not in folded.stderr, folded.stderr
    assert "[moe-backend] --moe-backend FlashInfer-CuteDSL" in folded.stdout, folded.stdout
    assert check("args.uvicorn-log-level=INFO").returncode == 2  # no conversion there: vLLM refuses it too
