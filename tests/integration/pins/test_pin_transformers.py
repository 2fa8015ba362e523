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
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from tests.gpu.e2e import tiny_models
from tests.support.tree_probe import BOOT_SITECUSTOMIZE
from tests.support.trees import sdist_tree, unpacked_wheel

from g4build.pins.model import load_pins

pytestmark = pytest.mark.network  # the pinned sdists and the transformers wheels (cached after the first run)

HERE = Path(__file__).parent
HUB = ("huggingface-hub", "huggingface_hub-1.33.0-py3-none-any.whl")
TOKENIZERS = {"0.22.2": ("tokenizers", "tokenizers-0.22.2-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
              "0.23.3": ("tokenizers", "tokenizers-0.23.3-cp310-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")}
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


def _tokenizers_for(unpacked: Path) -> str:
    """The tokenizers (of TOKENIZERS) this transformers wheel's METADATA accepts (5.16 and later want 0.23)."""
    metadata = next(unpacked.glob("*.dist-info/METADATA")).read_text(encoding="utf-8")
    wanted = next(Requirement(line.removeprefix("Requires-Dist: ")) for line in metadata.splitlines()
                  if line.startswith("Requires-Dist: tokenizers"))
    return next(v for v in TOKENIZERS if v in wanted.specifier)


def _model_config(pin: str, transformers: str, tmp_path: Path) -> dict[str, object]:
    """The pin's own ModelConfig for the Gemma 4 config, under registry transformers ``transformers``."""
    boot = tmp_path / "boot"
    boot.mkdir(parents=True)
    (boot / "sitecustomize.py").write_text(BOOT_SITECUSTOMIZE)
    unpacked = unpacked_wheel("transformers", f"transformers-{transformers}-py3-none-any.whl")
    wheels = [HUB, TOKENIZERS[_tokenizers_for(unpacked)]]
    path = [str(boot), str(unpacked), *(str(unpacked_wheel(project, name)) for project, name in wheels),
            str(sdist_tree(pin))]
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


# Each recorded range at its edges (fourth review, 2): the lowest version it admits reads Gemma 4's 512-wide full
# layers in the pin's own tree, and so does the newest release where no upper bound is recorded.
EDGES = [("vllm-0.21.0", "5.5.1"), ("vllm-0.26.0", "5.5.3"), ("vllm-0.29.0", "5.10.4"), ("vllm-0.29.0", "5.21.0"),
         ("vllm-0.33.0", "5.16.1")]


@pytest.mark.heavy  # a tree probe and a transformers wheel per edge
@pytest.mark.parametrize(("pin", "version"), EDGES)
def test_the_recorded_range_reads_gemma4_at_its_edges(pin: str, version: str, tmp_path: Path) -> None:
    recorded = SpecifierSet(load_pins().get(pin).transformers or "")
    assert version in recorded
    lower = min((v for v in ("5.5.0", "5.5.1", "5.5.2", "5.5.3", "5.10.4", "5.16.1") if v in recorded),
                key=lambda v: tuple(map(int, v.split("."))))
    assert version == lower or pin == "vllm-0.29.0", (pin, version, lower)
    facts = _model_config(pin, version, tmp_path)
    assert facts["error"] is None and facts["head_size"] == 512, facts


def test_no_transformers_the_releases_admit_below_the_recorded_ranges_knows_gemma4() -> None:
    """0.21.0 admits 4.56-4.57 and then 5.5.1 on (not 5.0-5.5.0): the 4.x line has no Gemma 4, so 5.5.1 is where it
    starts reading; the other pins' lower bounds are their own requirement's."""
    newest_4x = unpacked_wheel("transformers", "transformers-4.57.6-py3-none-any.whl")
    assert not (newest_4x / "transformers" / "models" / "gemma4").exists()
    first = unpacked_wheel("transformers", "transformers-5.5.1-py3-none-any.whl")
    assert (first / "transformers" / "models" / "gemma4" / "configuration_gemma4.py").is_file()
    own = Requirement(_requirement("vllm-0.21.0")).specifier
    assert [v for v in ("4.57.6", "5.4.0", "5.5.0", "5.5.1") if v in own] == ["4.57.6", "5.5.1"]


def _requirement(pin: str) -> str:
    """The transformers line of the pin's own requirements/common.txt."""
    text = (sdist_tree(pin) / "requirements" / "common.txt").read_text(encoding="utf-8")
    return next(line.split("#")[0].strip() for line in text.splitlines() if line.startswith("transformers"))


def test_the_releases_own_requirements_are_the_recorded_texts() -> None:
    """The requirement texts the offline test holds the recorded ranges against (tests/unit/pins/test_pin_serving.py,
    RELEASE_TRANSFORMERS) are the sdists' own."""
    from tests.unit.pins.test_pin_serving import RELEASE_TRANSFORMERS

    assert {pin: _requirement(pin) for pin in RELEASE_TRANSFORMERS} == RELEASE_TRANSFORMERS
    assert set(RELEASE_TRANSFORMERS) == set(load_pins().pins)
