"""Gemma 4's sliding layers on FlashAttention, its full layers on Triton (AttentionConfig.backend_per_kind: upstream
on 0.33.0, added to 0.21.0 by gemma4-backend-decoupling), with exact multimodal-prefix rows (mm-prefix-fa), and
nobody else moved: the backend of every layer of a tiny Gemma 4 and a tiny Gemma 3 as the pinned trees' own model
code builds them (per_kind_probe.py), patched against pristine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.network

PINS = ["vllm-0.21.0", "vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"]
Facts = Callable[[str, str], dict[str, Any]]
MM_PREFIX_UNSUPPORTED = "exact multimodal-prefix rows support neither decode context parallel nor ALiBi"


def _backends(case: dict[str, Any]) -> list[str]:
    return [layer["backend"] for layer in case["layers"]]


@pytest.mark.parametrize("pin", PINS)
def test_gemma4_sliding_layers_on_flash_attn_full_layers_on_triton(per_kind_facts: Facts, pin: str) -> None:
    case = per_kind_facts(pin, "patched")["gemma4_sliding_fa"]
    assert case["config_error"] is None and case["error"] is None, case
    assert case["per_kind"] == {"sliding_window": "FLASH_ATTN"}
    # Gemma4Config still makes TRITON_ATTN the backend of every kind not named.
    assert case["backend"] == "TRITON_ATTN"
    by_kind = {(layer["sliding_window"] is not None, layer["head_size"]) for layer in case["layers"]}
    assert by_kind == {(True, 256), (False, 512)}  # the tiny model has both of Gemma 4's layer shapes
    for layer in case["layers"]:
        assert layer["mm_prefix"] is True, layer
        if layer["sliding_window"] is not None:
            # Window 128, head 256: FlashAttention, multimodal-prefix rows by the exact recompute.
            assert (layer["backend"], layer["recompute"], layer["head_size"]) == ("FLASH_ATTN", True, 256), layer
        else:
            assert (layer["backend"], layer["head_size"]) == ("TRITON_ATTN", 512), layer
    assert _backends(case) == ["FLASH_ATTN", "TRITON_ATTN", "FLASH_ATTN", "TRITON_ATTN"]


@pytest.mark.parametrize("pin", PINS)
def test_pristine_trees_cannot_do_it(per_kind_facts: Facts, pin: str) -> None:
    case = per_kind_facts(pin, "pristine")["gemma4_sliding_fa"]
    if pin == "vllm-0.21.0":
        # No per-kind backends at all.
        assert case["config_error"] is not None and "backend_per_kind" in case["config_error"]
    else:
        # Per-kind upstream, but FlashAttention serves mm-prefix only through FA4 (absent on SM120).
        assert case["layers"] is None
        assert "partial multimodal token full attention not supported" in case["error"]


@pytest.mark.parametrize("pin", PINS)
@pytest.mark.parametrize("model", ["gemma4", "gemma3"])
def test_no_model_changes_backend_unless_asked(per_kind_facts: Facts, pin: str, model: str) -> None:
    """Without an attention config, Gemma 4 and an mm-prefix model that is not Gemma 4 (Gemma 3) get, layer by
    layer, what the pristine tree gives them: TRITON_ATTN (Gemma 4 forced, Gemma 3 by automatic selection, which
    skips FlashAttention's opt-in recompute)."""
    patched = per_kind_facts(pin, "patched")[model]
    pristine = per_kind_facts(pin, "pristine")[model]
    assert patched["error"] is None and pristine["error"] is None
    assert _backends(patched) == _backends(pristine) == ["TRITON_ATTN"] * 4
    assert patched["backend"] == pristine["backend"]
    assert all(layer["mm_prefix"] for layer in patched["layers"])
    assert any(layer["sliding_window"] is not None for layer in patched["layers"])  # sliding layers were asked


@pytest.mark.parametrize("pin", PINS)
def test_a_kind_no_backend_can_serve_is_refused_at_startup(per_kind_facts: Facts, pin: str) -> None:
    facts = per_kind_facts(pin, "patched")
    # FlashAttention for Gemma 4's 512-dim full layers: refused when the layer is built, naming why.
    full = facts["gemma4_full_fa"]
    assert full["layers"] is None and "FLASH_ATTN" in full["error"] and "head_size not supported" in full["error"]
    # A kind that does not exist: refused by the config, naming the kinds that do.
    unknown = facts["gemma4_unknown_kind"]["config_error"]
    assert unknown is not None and "sliding" in unknown and "sliding_window" in unknown


@pytest.mark.parametrize("pin", PINS)
def test_gemma4_sliding_layers_refuse_dcp_and_alibi_for_mm_rows(per_kind_facts: Facts, pin: str) -> None:
    """The FlashAttentionImpl Gemma 4's code built for a sliding layer, on a batch with an image range: decode
    context parallel and ALiBi are refused with the series' message instead of rows that are silently causal or
    misaligned."""
    refusals = per_kind_facts(pin, "patched")["gemma4_sliding_fa"]["refusals"]
    assert refusals["window"] == [127, 0] and refusals["head_size"] == 256
    for what in ("dcp", "alibi"):
        assert refusals[what] is not None and MM_PREFIX_UNSUPPORTED in refusals[what], (what, refusals[what])
        assert "TRITON_ATTN" in refusals[what]  # says what to do


def test_021_v2_runner_refuses_per_kind_backends(per_kind_facts: Facts) -> None:
    """0.21.0's V2 runner views each layer's share of the hybrid KV pool in its backend's own layout (only the V1
    runner makes mixed FlashAttention / Triton views block-major): it refuses per-kind backends by name."""
    refusal = per_kind_facts("vllm-0.21.0", "patched")["gemma4_sliding_fa"]["v2_runner"]
    assert refusal is not None and "VLLM_USE_V2_MODEL_RUNNER" in refusal and "backend_per_kind" in refusal


@pytest.mark.parametrize("pin", PINS)
def test_the_recipes_attention_config_is_what_vllm_serve_parses(per_kind_facts: Facts, pin: str) -> None:
    """The words the sliding-FA recipe renders (`--attention-config JSON`) through the tree's own `vllm serve` argument
    parser and EngineArgs: the patched trees run with the sliding layers' backend named; 0.21.0 as released refuses
    the field (0.33.0 has it upstream)."""
    cli = per_kind_facts(pin, "patched")["cli"]
    assert cli["words"][0] == "--attention-config"
    assert cli["error"] is None, cli["error"]
    assert cli["backend_per_kind"] == {"sliding_window": "FLASH_ATTN"} and cli["backend"] is None
    pristine = per_kind_facts(pin, "pristine")["cli"]
    if pin == "vllm-0.21.0":
        assert pristine["error"] is not None and "backend_per_kind" in pristine["error"]
    else:
        assert pristine["backend_per_kind"] == {"sliding_window": "FLASH_ATTN"}
