"""Prefix caching beside a drafter: `recipe check`/`render` warn on the pins whose GPU run read nothing back from
the prefix cache with a drafter, and name the pin that kept the hits. The list is tied to the kept GPU results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from g4build.pins.model import load_pins
from g4build.recipes import load_recipe
from g4build.recipes.findings import CheckContext, Finding
from g4build.recipes.model import parse_recipe
from g4build.recipes.prefix_cache import NO_PREFIX_HITS_WITH_A_DRAFTER
from g4build.recipes.rules import check

PINS = load_pins()
RESULTS = Path(__file__).resolve().parents[2] / "gpu" / "results"
DFLASH = {"method": "dflash", "model": "d", "num_speculative_tokens": 15, "attention_backend": "flash_attn"}
MTP = {"method": "mtp", "model": "m", "num_speculative_tokens": 4}


def findings(data: dict[str, Any], pin: str, **changes: Any) -> list[Finding]:
    r = parse_recipe({**data, "pin": pin, **changes}, "test.yaml")
    return [f for f in check(r, CheckContext(pin=PINS.get(pin), known_pins=tuple(PINS.pins)))
            if f.rule == "prefix-cache"]


@pytest.mark.parametrize("spec", [DFLASH, MTP], ids=["dflash", "mtp"])
def test_warns_on_029_with_a_drafter_and_names_the_pin_that_kept_hits(base_data: dict[str, Any],
                                                                     spec: dict[str, Any]) -> None:
    [f] = findings(base_data, "vllm-0.29.0", speculative=spec)
    assert f.severity == "warning" and "vllm-0.29.0" in f.message
    assert f"with its {spec['method'].replace('dflash', 'DFlash').upper()} drafter".lower() in f.message.lower()
    assert "--set pin=vllm-0.33.0" in f.hint and "g4build overlay --pin vllm-0.33.0" in f.hint


@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.26.0", "vllm-0.33.0"])
def test_silent_where_the_hits_were_kept(base_data: dict[str, Any], pin: str) -> None:
    assert findings(base_data, pin, speculative=DFLASH) == []


def test_silent_without_a_drafter_or_with_caching_off(base_data: dict[str, Any]) -> None:
    assert findings(base_data, "vllm-0.29.0") == []  # the target alone read its prefix back on 0.29.0
    for args in ({"enable-prefix-caching": False}, {"no-enable-prefix-caching": True}):
        assert findings(base_data, "vllm-0.29.0", speculative=MTP, args={**base_data["args"], **args}) == []
    on = {**base_data["args"], "enable-prefix-caching": True}
    assert len(findings(base_data, "vllm-0.29.0", speculative=MTP, args=on)) == 1


def test_a_retention_interval_is_noted_not_vouched_for(base_data: dict[str, Any]) -> None:
    args = {**base_data["args"], "prefix-cache-retention-interval": 64}
    [f] = findings(base_data, "vllm-0.29.0", speculative=DFLASH, args=args)
    assert f.severity == "info" and "not run" in f.message


def test_shipped_recipes_rendered_for_029_warn() -> None:
    for name in ("gemma4-26b-a4b-nvfp4-dflash", "gemma4-26b-a4b-nvfp4-mtp"):
        r = load_recipe(name, ["pin=vllm-0.29.0"])
        ctx = CheckContext(pin=PINS.get("vllm-0.29.0"), known_pins=tuple(PINS.pins))
        assert [f.severity for f in check(r, ctx) if f.rule == "prefix-cache"] == ["warning"], name


def _kept_hits(res: dict[str, Any]) -> bool | None:
    """Whether a kept result's drafter runs read their prefixes back (None: no prefix runs in it)."""
    keys = [k for k in ("prefix_cache-default", "prefix_cache-mtp-default") if k in res]
    if not keys:
        return None
    return all(res[k]["every_longer_prompt_hit_the_cache"] for k in keys)


def test_the_list_is_what_the_gpu_results_show() -> None:
    kept = {p.name.removesuffix("-acceptance.json"): _kept_hits(json.loads(p.read_text()))
            for p in RESULTS.glob("vllm-*-acceptance.json")}
    assert {pin for pin, hits in kept.items() if hits is False} == set(NO_PREFIX_HITS_WITH_A_DRAFTER)
    for better in NO_PREFIX_HITS_WITH_A_DRAFTER.values():
        assert kept[better] is True
