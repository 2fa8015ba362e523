"""Prefix caching beside a drafter: `recipe check`/`render` warn on the pins whose GPU run read nothing back from
the prefix cache with a drafter, and name the pins that kept the hits. The list is tied to the kept GPU results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from g4build.pins.model import load_pins
from g4build.recipes import load_recipe
from g4build.recipes.findings import CheckContext, Finding, WheelInfo
from g4build.recipes.model import parse_recipe
from g4build.recipes.prefix_cache import NO_PREFIX_HITS_WITH_A_DRAFTER
from g4build.recipes.rules import check

PINS = load_pins()
RESULTS = Path(__file__).resolve().parents[2] / "gpu" / "results"
DFLASH = {"method": "dflash", "model": "d", "num_speculative_tokens": 15, "attention_backend": "flash_attn"}
MTP = {"method": "mtp", "model": "m", "num_speculative_tokens": 4}
GEMMA4_KV = {"full_layers": 5, "full_kv_heads": 2, "full_head_dim": 512, "sliding_layers": 25,
             "sliding_kv_heads": 8, "sliding_head_dim": 256, "sliding_window": 1024}


def findings(data: dict[str, Any], pin: str, wheel: WheelInfo | None = None, **changes: Any) -> list[Finding]:
    r = parse_recipe({**data, "pin": pin, **changes}, "test.yaml")
    ctx = CheckContext(pin=PINS.get(pin), known_pins=tuple(PINS.pins), wheel=wheel)
    return [f for f in check(r, ctx) if f.rule == "prefix-cache"]


@pytest.mark.parametrize(("spec", "name"), [
    (DFLASH, "a DFlash"), (MTP, "an MTP"),
    # the rest of 0.29.0's EAGLE family (its use_eagle()) drops the same last block
    ({"method": "eagle3", "model": "e", "num_speculative_tokens": 3}, "an EAGLE-3"),
    ({"method": "eagle", "model": "e", "num_speculative_tokens": 3}, "an EAGLE"),
    ({"method": "dspark", "model": "e", "num_speculative_tokens": 3}, "a DSpark"),
])
def test_warns_on_029_with_a_drafter_and_names_the_pins_that_kept_hits(base_data: dict[str, Any],
                                                                      spec: dict[str, Any], name: str) -> None:
    [f] = findings(base_data, "vllm-0.29.0", speculative=spec)
    assert f.severity == "warning" and f"on vllm-0.29.0 with {name} drafter" in f.message
    assert "0 cached tokens" in f.message and "outputs are unchanged" in f.message
    assert "--set pin=vllm-0.33.0" in f.hint and "g4build overlay --pin vllm-0.33.0" in f.hint
    assert "vllm-0.26.0" in f.hint


@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.26.0", "vllm-0.33.0"])
def test_silent_where_the_hits_were_kept(base_data: dict[str, Any], pin: str) -> None:
    assert findings(base_data, pin, speculative=DFLASH) == []


def test_silent_without_an_eagle_family_drafter_or_with_caching_off(base_data: dict[str, Any]) -> None:
    assert findings(base_data, "vllm-0.29.0") == []  # the target alone read its prefix back on 0.29.0
    for method in ("ngram", "suffix", "draft_model"):  # no last-block drop for these in 0.29.0
        assert findings(base_data, "vllm-0.29.0", speculative={"method": method, "num_speculative_tokens": 4}) == []
    for args in ({"enable-prefix-caching": False}, {"no-enable-prefix-caching": True}):
        assert findings(base_data, "vllm-0.29.0", speculative=MTP, args={**base_data["args"], **args}) == []
    on = {**base_data["args"], "enable-prefix-caching": True}
    assert len(findings(base_data, "vllm-0.29.0", speculative=MTP, args=on)) == 1


def test_silent_for_a_model_without_sliding_window_layers(base_data: dict[str, Any]) -> None:
    llama = {**base_data, "family": "llama", "model": "./models/llama"}
    assert findings(llama, "vllm-0.29.0", speculative=MTP) == []
    full_only = {**GEMMA4_KV, "sliding_layers": 0}
    assert findings(base_data, "vllm-0.29.0", speculative=MTP,
                    footprint={"weights_gib": 1.0, "kv": full_only}) == []
    assert len(findings(llama, "vllm-0.29.0", speculative=MTP, footprint={"weights_gib": 1.0, "kv": GEMMA4_KV})) == 1


def test_the_wheels_pin_decides(base_data: dict[str, Any]) -> None:
    wheel = WheelInfo(file="vllm-0.29.0+g4.x-cp38-abi3-manylinux_2_28_x86_64.whl", pin="vllm-0.29.0")
    assert len(findings(base_data, "vllm-0.21.0", wheel=wheel, speculative=DFLASH)) == 1
    newer = WheelInfo(file="vllm-0.33.0+g4.x-cp38-abi3-manylinux_2_28_x86_64.whl", pin="vllm-0.33.0")
    assert findings(base_data, "vllm-0.29.0", wheel=newer, speculative=DFLASH) == []


def test_a_retention_interval_is_named_not_vouched_for(base_data: dict[str, Any]) -> None:
    env_64 = {"VLLM_PREFIX_CACHE_RETENTION_INTERVAL": "64"}
    for args, env in (({"prefix-cache-retention-interval": 64}, {}), ({}, env_64)):
        [f] = findings(base_data, "vllm-0.29.0", speculative=DFLASH, args={**base_data["args"], **args},
                       env={**base_data["env"], **env})
        assert f.severity == "warning" and "is 64, which has not run on one" in f.message
    # 0 is the default that read nothing back: the plain warning
    [f] = findings(base_data, "vllm-0.29.0", speculative=DFLASH,
                   args={**base_data["args"], "prefix-cache-retention-interval": 0})
    assert "0 cached tokens" in f.message


def test_shipped_recipes_rendered_for_029_warn() -> None:
    for name in ("gemma4-26b-a4b-nvfp4-dflash", "gemma4-26b-a4b-nvfp4-mtp"):
        r = load_recipe(name, ["pin=vllm-0.29.0"])
        ctx = CheckContext(pin=PINS.get("vllm-0.29.0"), known_pins=tuple(PINS.pins))
        assert [f.severity for f in check(r, ctx) if f.rule == "prefix-cache"] == ["warning"], name


def _read_nothing_back(res: dict[str, Any]) -> bool | None:
    """Whether a kept result's drafter runs read nothing back on any second run (None: no prefix runs in it)."""
    keys = [k for k in ("prefix_cache-default", "prefix_cache-mtp-default") if k in res]
    if not keys:
        return None
    return all(not any(p["cached_tokens_on_hit"] for p in res[k]["pairs"]) for k in keys)


def test_the_list_is_what_the_gpu_results_show() -> None:
    kept = {p.name.removesuffix("-acceptance.json"): _read_nothing_back(json.loads(p.read_text()))
            for p in RESULTS.glob("vllm-*-acceptance.json")}
    assert {pin for pin, nothing in kept.items() if nothing} == set(NO_PREFIX_HITS_WITH_A_DRAFTER)
    for better in NO_PREFIX_HITS_WITH_A_DRAFTER.values():
        assert all(kept[pin] is False for pin in better)
