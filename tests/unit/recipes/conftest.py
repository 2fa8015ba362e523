"""Fixtures for the recipe unit tests: a minimal valid recipe mapping, written to tmp_path when needed."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from tests.support.yamltext import yaml_text

BASE: dict[str, Any] = {
    "name": "unit-recipe",
    "description": "a recipe for tests",
    "family": "gemma4",
    "model": "./models/target",
    "served_model_names": ["served"],
    "checkpoint": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
    "hardware": {"vram_gb": 32, "arch": "sm120"},
    "pin": "vllm-0.21.0",
    "needs_series": [],
    "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
    "args": {"max-model-len": 8192, "max-num-seqs": 4, "gpu-memory-utilization": 0.8},
    "speculative": None,
    "notes": "",
}


@pytest.fixture
def base_data() -> dict[str, Any]:
    return copy.deepcopy(BASE)


@pytest.fixture
def write_recipe(tmp_path: Path):  # type: ignore[no-untyped-def]
    def write(data: dict[str, Any]) -> Path:
        path = tmp_path / f"{data['name']}.yaml"
        path.write_text(yaml_text(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
        return path

    return write
