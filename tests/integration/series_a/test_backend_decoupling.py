"""gemma4-backend-decoupling, through the pinned trees' own config code: a DFlash drafter on a multimodal-prefix
target with a forced backend (Gemma4's) gets neither the mm-prefix flag nor the forced backend, an explicit
attention_backend wins, and KV-shared MTP (Gemma4Proposer) keeps inheriting. Pristine trees show the bug."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.network

PINS = ["vllm-0.21.0", "vllm-0.33.0"]

Facts = Callable[[str, str], dict[str, Any]]


@pytest.mark.parametrize("pin", PINS)
def test_v1_dflash_draft_config_is_text_only_with_its_own_backend(tree_facts: Facts, pin: str) -> None:
    facts = tree_facts(pin, "patched")
    assert facts["target_backend"] == "TRITON_ATTN"
    assert facts["v1_dflash"] == {"mm_prefix": False, "backend": None, "flash_attn_refuses": False}
    assert facts["v1_dflash_explicit"] == {"mm_prefix": False, "backend": "FLASH_ATTN", "flash_attn_refuses": False}
    # The target keeps its flag, its arch config and its backend.
    assert facts["target_after"] == {
        "mm_prefix": True,
        "arch_mm_prefix": True,
        "arch_before": True,
        "backend": "TRITON_ATTN",
    }


@pytest.mark.parametrize("pin", PINS)
def test_mtp_still_inherits_the_target(tree_facts: Facts, pin: str) -> None:
    facts = tree_facts(pin, "patched")
    assert facts["v1_mtp"] == {"mm_prefix": True, "backend": "TRITON_ATTN", "same_model_config": True}


def test_v2_dflash_layers_and_builders_on_033(tree_facts: Facts) -> None:
    facts = tree_facts("vllm-0.33.0", "patched")
    text_only = {"mm_prefix": False, "backend": None, "flash_attn_refuses": False}
    assert facts["v2"]["layers"] == text_only
    assert facts["v2"]["builders"] == text_only
    assert facts["v2"]["builders_non_causal"] is True
    explicit = {"mm_prefix": False, "backend": "FLASH_ATTN", "flash_attn_refuses": False}
    assert facts["v2_explicit"]["layers"] == explicit
    assert facts["v2_explicit"]["builders"] == explicit
    assert facts["v2"]["target_mm_prefix_after"] is True


def test_021_has_no_v2_dflash_path(tree_facts: Facts) -> None:
    # 0.21.0's V2 runner rejects method dflash, so only V1 needs the fix there.
    assert tree_facts("vllm-0.21.0", "patched")["v2"] is None


@pytest.mark.parametrize("pin", PINS)
def test_pristine_trees_show_the_bug(tree_facts: Facts, pin: str) -> None:
    facts = tree_facts(pin, "pristine")
    # The user's failure: FlashAttention refuses the DFlash draft layers for mm-prefix.
    assert facts["v1_dflash_explicit"]["backend"] == "FLASH_ATTN"
    assert facts["v1_dflash_explicit"]["flash_attn_refuses"] is True
    assert facts["v1_dflash"]["mm_prefix"] is True
    if pin == "vllm-0.33.0":
        # Upstream's V1 fix edits the target's own arch config, but the cached flag stays True.
        assert facts["target_after"]["arch_mm_prefix"] is False
        assert facts["v2"]["layers"]["mm_prefix"] is True
        assert facts["v2_explicit"]["builders"]["backend"] == "TRITON_ATTN"
