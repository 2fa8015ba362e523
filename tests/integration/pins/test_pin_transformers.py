"""Which transformers each pin reads Gemma 4 checkpoints with (patches/pins.yaml ``transformers``), shown by the
releases' own code: each pin's tree builds its ModelConfig for a Gemma 4 config with the fields the published
checkpoints have (global_head_dim 512 beside head_dim 256, no per_layer_config), under registry transformers wheels
on both sides of the recorded bound. transformers 5.15 moved global_head_dim into a per-layer config: 0.21.0 and
0.26.0 then raise, 0.29.0 reads it per layer.

The config names Gemma4ForCausalLM, Gemma 4's text model: vLLM inspects the model class, and the multimodal class
imports Gemma4Processor, which needs a torchvision this CPU torch lacks. The config handling is the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from tests.gpu.e2e import tiny_models
from tests.support.tree_probe import BOOT_SITECUSTOMIZE
from tests.support.trees import sdist_tree, unpacked_wheel

from g4build.pins.model import load_pins

pytestmark = pytest.mark.network  # the pinned sdists and the transformers wheels (cached after the first run)

HERE = Path(__file__).parent
HUB = ("huggingface-hub", "huggingface_hub-1.33.0-py3-none-any.whl")
TOKENIZERS = ("tokenizers", "tokenizers-0.22.2-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
LAST_BEFORE, BOUND = "5.14.0", "5.15.0"  # the last minor before the per-layer config, and the first with it


def _config_dir(tmp_path: Path) -> Path:
    text = tiny_models.text_config()
    del text["per_layer_config"]  # the published configs have none: transformers 5.15+ makes one
    config = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4", "text_config": text,
              "vision_config": tiny_models.vision_config(), "dtype": "bfloat16"}
    folder = tmp_path / "gemma4"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def _model_config(pin: str, transformers: str, tmp_path: Path) -> dict[str, object]:
    """The pin's own ModelConfig for the Gemma 4 config, under registry transformers ``transformers``."""
    boot = tmp_path / "boot"
    boot.mkdir(parents=True)
    (boot / "sitecustomize.py").write_text(BOOT_SITECUSTOMIZE)
    wheels = [("transformers", f"transformers-{transformers}-py3-none-any.whl"), HUB, TOKENIZERS]
    path = [str(boot), *(str(unpacked_wheel(project, name)) for project, name in wheels), str(sdist_tree(pin))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONDONTWRITEBYTECODE": "1",
           "VLLM_LOGGING_LEVEL": "ERROR"}
    proc = subprocess.run([sys.executable, str(HERE / "gemma4_config_probe.py"), str(_config_dir(tmp_path))],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("GEMMA4_CONFIG ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    facts: dict[str, object] = json.loads(lines[-1].removeprefix("GEMMA4_CONFIG "))
    assert facts["transformers"] == transformers
    return facts


@pytest.mark.parametrize("pin", ["vllm-0.21.0", pytest.param("vllm-0.26.0", marks=pytest.mark.heavy)])
def test_the_recorded_bound_is_where_the_release_stops_reading_gemma4(pin: str, tmp_path: Path) -> None:
    recorded = load_pins().get(pin).transformers
    assert recorded is not None
    assert LAST_BEFORE in SpecifierSet(recorded) and BOUND not in SpecifierSet(recorded)
    inside = _model_config(pin, LAST_BEFORE, tmp_path / "inside")
    assert inside["error"] is None and inside["head_size"] == 512, inside
    outside = _model_config(pin, BOUND, tmp_path / "outside")
    assert outside["error"] == "AmbiguousGlobalPerLayerAttributeError", outside


@pytest.mark.heavy  # a third tree probe (~20 s on two cores): the contrast, not the recorded bound
def test_a_release_that_reads_per_layer_configs_has_no_such_bound(tmp_path: Path) -> None:
    recorded = load_pins().get("vllm-0.29.0").transformers
    assert recorded is not None and BOUND in SpecifierSet(recorded)
    facts = _model_config("vllm-0.29.0", BOUND, tmp_path)
    assert facts["error"] is None and facts["head_size"] == 512, facts
