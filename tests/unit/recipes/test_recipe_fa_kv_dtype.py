"""An fp8 KV cache beside FlashAttention layers (third review, 11): FlashAttention serves it only as FA3 (SM90), so on
SM120 (FA2) a DFlash drafter or sliding layers on FlashAttention are refused at start. `recipe check` refuses that
setup, and the VRAM rule no longer suggests --kv-cache-dtype fp8 where it would be refused."""

from __future__ import annotations

import dataclasses

import pytest

from g4build.pins.model import load_pins
from g4build.recipes import load_recipe
from g4build.recipes.model import Hardware, Recipe
from g4build.recipes.rules import CheckContext, Finding, check
from g4build.series.model import load_all

PINS = load_pins()


def _check(recipe: Recipe) -> tuple[Finding, ...]:
    ctx = CheckContext(pin=PINS.get(recipe.pin), known_pins=tuple(PINS.pins), series=tuple(load_all()))
    return check(recipe, ctx)


def _with(name: str, arch: str = "sm120", **args: object) -> Recipe:
    recipe = load_recipe(name)
    return dataclasses.replace(recipe, args={**recipe.args, **args},
                               hardware=Hardware(vram_gb=recipe.hardware.vram_gb, arch=arch))


@pytest.mark.parametrize("name", ["gemma4-26b-a4b-nvfp4-dflash", "gemma4-26b-a4b-nvfp4-sliding-fa"])
def test_fp8_kv_cache_with_flash_attention_on_sm120_is_refused(name: str) -> None:
    refused = [f for f in _check(_with(name, **{"kv-cache-dtype": "fp8"})) if f.rule == "kv-cache-dtype"]
    assert [f.severity for f in refused] == ["error"]
    assert "FA3 (SM90)" in refused[0].message
    assert not [f for f in _check(_with(name)) if f.rule == "kv-cache-dtype"]  # auto: fine
    assert not [f for f in _check(_with(name, "sm90", **{"kv-cache-dtype": "fp8"})) if f.rule == "kv-cache-dtype"]


def test_fp8_kv_cache_without_flash_attention_layers_is_not_this_rules_business() -> None:
    assert not [f for f in _check(_with("gemma4-26b-a4b-nvfp4-baseline", **{"kv-cache-dtype": "fp8"}))
                if f.rule == "kv-cache-dtype"]


def test_vram_hint_offers_fp8_only_where_it_runs() -> None:
    tight = {"max-num-seqs": 512}
    dflash = [f for f in _check(_with("gemma4-26b-a4b-nvfp4-dflash", **tight)) if f.rule == "vram"]
    assert dflash and all("fp8" not in (f.hint or "") for f in dflash), dflash
    baseline = [f for f in _check(_with("gemma4-26b-a4b-nvfp4-baseline", **tight)) if f.rule == "vram"]
    assert any("--kv-cache-dtype fp8" in (f.hint or "") for f in baseline), baseline
