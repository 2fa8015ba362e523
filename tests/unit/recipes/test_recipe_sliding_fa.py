"""sliding_attention_backend: what it renders (the --attention-config vLLM reads on both pins) and when `recipe check`
accepts it (pin and wheel with per-kind backends and the exact mm-prefix recompute, an arch with FlashAttention 2,
sliding layers of head dim <= 256, no decode context parallel, no V2 runner on 0.21.0)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from g4build.errors import ConfigError, RecipeError
from g4build.pins.model import load_pins
from g4build.recipes import load_recipe
from g4build.recipes.argv import serve_argv
from g4build.recipes.checkpoint import CheckpointInfo
from g4build.recipes.model import KvGeometry, Recipe, parse_recipe
from g4build.recipes.rules import CheckContext, Finding, WheelInfo, check
from g4build.series.model import load_all

PINS = load_pins()
SERIES = tuple(load_all())  # this checkout's series: their versions are what the rule compares against
GEMMA4_KV = {"full_layers": 5, "full_kv_heads": 2, "full_head_dim": 512, "sliding_layers": 25,
             "sliding_kv_heads": 8, "sliding_head_dim": 256, "sliding_window": 1024}
PER_KIND = {"backend_per_kind": {"sliding_window": "FLASH_ATTN"}}


def recipe(data: dict[str, Any], **changes: Any) -> Recipe:
    merged = {**data, "sliding_attention_backend": "flash_attn", "footprint": {"weights_gib": 1.0, "kv": GEMMA4_KV},
              **changes}
    return parse_recipe(merged, "test.yaml")


def ctx(pin: str | None = "vllm-0.21.0", **changes: Any) -> CheckContext:
    base = CheckContext(pin=PINS.get(pin) if pin else None, known_pins=tuple(PINS.pins), series=SERIES)
    return dataclasses.replace(base, **changes)


def sliding(findings: tuple[Finding, ...], severity: str | None = None) -> list[Finding]:
    return [f for f in findings if f.rule == "sliding-fa" and (severity is None or f.severity == severity)]


def attention_json(argv: list[str]) -> Any:
    return json.loads(argv[argv.index("--attention-config") + 1])


# --- what it renders -------------------------------------------------------------------------------------
def test_renders_the_per_kind_attention_config(base_data: dict[str, Any]) -> None:
    argv = serve_argv(recipe(base_data))
    assert argv.count("--attention-config") == 1
    assert attention_json(argv) == PER_KIND
    assert argv.index("--attention-config") > argv.index("--gpu-memory-utilization")  # after the recipe's args


def test_off_renders_nothing(base_data: dict[str, Any]) -> None:
    argv = serve_argv(recipe(base_data, sliding_attention_backend=None))
    assert "--attention-config" not in argv
    assert not sliding(check(recipe(base_data, sliding_attention_backend=None), ctx()))


def test_merges_into_the_recipes_own_attention_config_in_place(base_data: dict[str, Any]) -> None:
    args = {"attention-config": {"flash_attn_version": 2, "backend_per_kind": {"full_attention": "TRITON_ATTN"}},
            "max-model-len": 8192}
    argv = serve_argv(recipe(base_data, args=args))
    assert argv.count("--attention-config") == 1
    assert argv.index("--attention-config") < argv.index("--max-model-len")  # where the recipe put it
    assert attention_json(argv) == {
        "flash_attn_version": 2,
        "backend_per_kind": {"full_attention": "TRITON_ATTN", "sliding_window": "FLASH_ATTN"},
    }


def test_a_conflicting_sliding_backend_in_args_is_refused(base_data: dict[str, Any]) -> None:
    args = {"attention-config": {"backend_per_kind": {"sliding_window": "TRITON_ATTN"}}}
    with pytest.raises(RecipeError, match="sliding_window"):
        serve_argv(recipe(base_data, args=args))
    same = {"attention-config": {"backend_per_kind": {"sliding_window": "flash_attn"}}}
    assert attention_json(serve_argv(recipe(base_data, args=same))) == PER_KIND


def test_only_flash_attn_or_null_parse(base_data: dict[str, Any]) -> None:
    assert recipe(base_data, sliding_attention_backend="FLASH_ATTN").sliding_attention_backend == "flash_attn"
    with pytest.raises(ConfigError, match="flash_attn"):
        recipe(base_data, sliding_attention_backend="triton_attn")


def test_set_turns_it_on_for_a_shipped_recipe() -> None:
    r = load_recipe("gemma4-26b-a4b-nvfp4-baseline", ["sliding_attention_backend=flash_attn"])
    assert attention_json(serve_argv(r)) == PER_KIND


def test_the_shipped_recipe_renders_it() -> None:
    r = load_recipe("gemma4-26b-a4b-nvfp4-sliding-fa")
    assert r.sliding_attention_backend == "flash_attn"
    assert attention_json(serve_argv(r)) == PER_KIND
    assert not sliding(check(r, ctx()), "error")


# --- when it is valid ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("pin", "needed"), [
    ("vllm-0.21.0", {"gemma4-backend-decoupling": 3, "mm-prefix-fa": 3}),
    ("vllm-0.26.0", {"mm-prefix-fa": 4}),
    ("vllm-0.29.0", {"mm-prefix-fa": 4}),
    ("vllm-0.33.0", {"mm-prefix-fa": 3}),
])
def test_wheel_must_carry_the_series_versions_that_serve_it(base_data: dict[str, Any], pin: str,
                                                             needed: dict[str, int]) -> None:
    r = recipe(base_data, pin=pin)
    good = WheelInfo(file="w.whl", pin=pin, series=dict(needed))
    assert not sliding(check(r, ctx(pin, wheel=good)), "error")
    for name, first in needed.items():
        older = dataclasses.replace(good, series={**needed, name: first - 1})
        [finding] = sliding(check(r, ctx(pin, wheel=older)), "error")
        assert name in finding.message and f"v{first}" in finding.message
        lacking = dataclasses.replace(good, series={k: v for k, v in needed.items() if k != name})
        [finding] = sliding(check(r, ctx(pin, wheel=lacking)), "error")
        assert "does not carry" in finding.message
    stock = WheelInfo(file="vllm.whl", pin=None, series={})
    assert len(sliding(check(r, ctx(pin, wheel=stock)), "error")) == len(needed)


def test_without_a_wheel_the_stock_wheel_is_warned_about_once(base_data: dict[str, Any]) -> None:
    r = recipe(base_data, needs_series=[])
    assert len(sliding(check(r, ctx()), "warning")) == 2  # both series, said by this rule
    listed = recipe(base_data, needs_series=["gemma4-backend-decoupling", "mm-prefix-fa"])
    assert not sliding(check(listed, ctx()), "warning")  # the series rule says it for listed series


def test_a_pin_not_known_to_serve_it_is_an_error(base_data: dict[str, Any]) -> None:
    unknown = dataclasses.replace(PINS.get("vllm-0.21.0"), name="vllm-0.99.0")
    [finding] = sliding(check(recipe(base_data), dataclasses.replace(ctx(), pin=unknown)), "error")
    assert "vllm-0.99.0" in finding.message and "vllm-0.21.0" in finding.hint


@pytest.mark.parametrize(("arch", "severity"), [("sm75", "error"), ("sm80", None), ("sm90", None),
                                                 ("sm120", "info"), ("sm121", "info")])
def test_arch_needs_flash_attention_2(base_data: dict[str, Any], arch: str, severity: str | None) -> None:
    r = recipe(base_data, hardware={"vram_gb": 32, "arch": arch})
    about_arch = [f for f in sliding(check(r, ctx())) if arch in f.message]
    assert [f.severity for f in about_arch] == ([severity] if severity else [])


def test_sliding_head_dim_above_256_is_an_error(base_data: dict[str, Any]) -> None:
    assert not sliding(check(recipe(base_data), ctx()), "error")
    wide = {**GEMMA4_KV, "sliding_head_dim": 512}
    [finding] = sliding(check(recipe(base_data, footprint={"weights_gib": 1.0, "kv": wide}), ctx()), "error")
    assert "512" in finding.message
    # The checkpoint (--model-dir) wins over the recipe's estimate.
    target = CheckpointInfo(path="m", architectures=("Gemma4ForConditionalGeneration",), model_type="gemma4",
                            quant_method=None, quant_algo=None, head_dim=512, global_head_dim=512,
                            kv=KvGeometry(**wide), weights_bytes=0)
    assert sliding(check(recipe(base_data), ctx(target=target)), "error")


def test_no_sliding_layers_or_unknown_geometry(base_data: dict[str, Any]) -> None:
    full_only = {"full_layers": 4, "full_kv_heads": 2, "full_head_dim": 128}
    warnings = sliding(check(recipe(base_data, footprint={"weights_gib": 1.0, "kv": full_only}), ctx()), "warning")
    assert [f for f in warnings if "no sliding-window layers" in f.message]
    assert not [f for f in sliding(check(recipe(base_data), ctx())) if "no sliding-window layers" in f.message]
    unknown = sliding(check(recipe(base_data, footprint=None), ctx()), "info")
    assert any("not checked" in f.message for f in unknown)


@pytest.mark.parametrize("option", ["decode-context-parallel-size", "dcp"])
def test_decode_context_parallel_is_an_error(base_data: dict[str, Any], option: str) -> None:
    args = {**base_data["args"], option: 2}
    [finding] = sliding(check(recipe(base_data, args=args), ctx()), "error")
    assert "decode context parallel" in finding.message
    assert not sliding(check(recipe(base_data, args={**base_data["args"], option: 1}), ctx()), "error")


def test_every_layer_on_flash_attn_is_an_error(base_data: dict[str, Any]) -> None:
    args = {**base_data["args"], "attention-backend": "FLASH_ATTN"}
    assert sliding(check(recipe(base_data, args=args), ctx()), "error")
    triton = {**base_data["args"], "attention-backend": "TRITON_ATTN"}
    assert not sliding(check(recipe(base_data, args=triton), ctx()), "error")


def test_v2_runner_on_021_is_an_error(base_data: dict[str, Any]) -> None:
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    [finding] = sliding(check(recipe(base_data, env=env), ctx()), "error")
    assert "VLLM_USE_V2_MODEL_RUNNER" in finding.message
    # 0.33.0's V2 runner (its default) lays every backend's KV out alike.
    assert not sliding(check(recipe(base_data, env=env, pin="vllm-0.33.0"), ctx("vllm-0.33.0")), "error")


def test_needs_series_must_hold_what_its_series_require() -> None:
    """Third review, 7: backend_per_kind (gemma4-backend-decoupling on 0.21.0) puts FlashAttention and Triton views
    over one raw KV tensor; only dflash-batched-verification's block-major restride makes that correct. The shipped
    recipe names both; a recipe that leaves the restride out is refused, on 0.21.0 only (later pins' variants
    require nothing)."""
    shipped = load_recipe("gemma4-26b-a4b-nvfp4-sliding-fa")
    assert "dflash-batched-verification" in shipped.needs_series
    assert not [f for f in check(shipped, ctx()) if f.rule == "series" and "requires" in f.message]
    subset = dataclasses.replace(shipped, needs_series=("gemma4-backend-decoupling", "mm-prefix-fa"))
    refused = [f for f in check(subset, ctx()) if f.rule == "series" and f.severity == "error"]
    assert any("'gemma4-backend-decoupling'" in f.message and "'dflash-batched-verification'" in f.message
               for f in refused), refused
    assert not [f for f in check(subset, ctx("vllm-0.33.0")) if "requires" in f.message]
