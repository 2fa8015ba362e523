"""Each pin's vLLM argument table (recipes/vllm-args/<pin>.json: what `recipe --set` is checked against, offline)
is recorded for every pin and equals what the pin's own sdist gives today."""

from __future__ import annotations

import json

import pytest

from g4build.pins.index import cache_root, fetch_verified
from g4build.pins.model import load_pins
from g4build.recipes.vllm_args import _TABLE_VERSION, recorded_table, recorded_table_path, table_from_sdist

PINS = sorted(load_pins().pins)


@pytest.mark.parametrize("name", PINS)
def test_every_pin_has_a_current_recorded_table(name: str) -> None:
    pin = load_pins().get(name)
    path = recorded_table_path(pin)
    assert path.is_file(), f"{path} is missing: `g4build pins add` writes it (or record_table(pin, root))"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["sdist_sha256"] == pin.sdist.sha256.lower() and data["table_version"] == _TABLE_VERSION
    assert recorded_table(pin) == data
    # the server and engine options a recipe uses, and the drafter's fields
    assert {"max-model-len", "port", "served-model-name"} <= set(data["args"])
    assert {"method", "model", "num_speculative_tokens"} <= set(data["speculative"])


@pytest.mark.network  # the pinned sdists (34-47 MB each), fetched once into the shared cache
@pytest.mark.parametrize("name", PINS)
def test_the_recorded_table_is_what_the_sdist_gives(name: str) -> None:
    pin = load_pins().get(name)
    sdist = fetch_verified("vllm", pin.sdist.file, pin.sdist.sha256, cache_dir=cache_root() / "sdists").path
    assert json.loads(recorded_table_path(pin).read_text(encoding="utf-8")) == table_from_sdist(pin, sdist), (
        f"regenerate with record_table for {name} and review the diff")
