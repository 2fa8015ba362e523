"""gemma4-backend-decoupling, through the pinned trees' own config code: a DFlash drafter on a multimodal-prefix
target with a forced backend (Gemma4's) gets neither the mm-prefix flag nor the forced backend (nor the
target's per-kind backends), an explicit attention_backend wins for every drafter layer kind, and KV-shared MTP
(Gemma4Proposer) keeps inheriting. Pristine trees show the bug."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.network

PINS = ["vllm-0.21.0", "vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"]
# the releases with a V2 DFlash path and per-kind backends upstream
V2_DFLASH = {"vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"}

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


@pytest.mark.parametrize("pin", sorted(V2_DFLASH))
def test_v2_dflash_layers_and_builders(tree_facts: Facts, pin: str) -> None:
    facts = tree_facts(pin, "patched")
    text_only = {"mm_prefix": False, "backend": None, "flash_attn_refuses": False}
    assert facts["v2"]["layers"] == text_only
    assert facts["v2"]["builders"] == text_only
    assert facts["v2"]["builders_non_causal"] is True
    explicit = {"mm_prefix": False, "backend": "FLASH_ATTN", "flash_attn_refuses": False}
    assert facts["v2_explicit"]["layers"] == explicit
    assert facts["v2_explicit"]["builders"] == explicit
    assert facts["v2"]["target_mm_prefix_after"] is True


SPEC = "FLASH_ATTN"  # the speculative config's attention_backend
PER_KIND = "FLEX_ATTENTION"  # the target's backend_per_kind, for both kinds
KINDS = ("full_attention", "sliding_window")


@pytest.mark.parametrize("pin", PINS)
def test_drafter_layers_ignore_the_targets_per_kind_backends(tree_facts: Facts, pin: str) -> None:
    """0.33.0 has per-kind backends upstream; on 0.21.0 this series adds them (0002), and the V1 DFlash drafter
    (0.21.0 has no V2 DFlash path) must not take the target's."""
    per_kind = tree_facts(pin, "patched")["per_kind"]
    # The selector does read the target's per-kind map (for the target's own layers).
    assert per_kind["target"] == dict.fromkeys(KINDS, PER_KIND)
    paths = ("v1_dflash", "v2_layers", "v2_builders") if pin in V2_DFLASH else ("v1_dflash",)
    assert ("v2_layers_auto" in per_kind) is (pin in V2_DFLASH)
    for path in paths:
        # No speculative backend: the selector chooses for each drafter layer, not the target's map.
        assert per_kind[f"{path}_auto"] == dict.fromkeys(KINDS), path
        # An explicit speculative backend wins for every drafter layer kind.
        assert per_kind[f"{path}_explicit"] == dict.fromkeys(KINDS, SPEC), path
    # KV-shared MTP reads the target's cache: it keeps the target's per-kind backends.
    assert per_kind["v1_mtp"] == dict.fromkeys(KINDS, PER_KIND)


@pytest.mark.parametrize("pin", sorted(V2_DFLASH))
def test_gemma4_dflash_user_stays_on_v2_with_the_drafters_own_backend(tree_facts: Facts, pin: str) -> None:
    facts = tree_facts(pin, "patched")
    runner = facts["runner"]
    # Gemma 4 DFlash drafters mix sliding and full layers: only the V2 runner takes them, and it is the default.
    assert runner["draft_layers_sliding"] == [True, False]
    if runner["v1_unsupported"] is not None:
        assert "mixed sliding/full dflash drafts" in runner["v1_unsupported"]
    else:  # 0.26.0 refuses them when the drafter's layers are built
        assert pin == "vllm-0.26.0"
        assert "mixed sliding/full attention require the V2 model runner" in runner["v1_layer_refusal"]
    assert runner["v2_unsupported"] == []
    assert runner["use_v2_model_runner"] is True
    assert runner["use_v2_model_runner_full_only_draft"] is True
    # On V2, both kinds of drafter layer (and their metadata builders) get the speculative backend,
    # without the target's mm-prefix flag, whatever the target's forced or per-kind backend.
    assert facts["per_kind"]["v2_layers_explicit"] == dict.fromkeys(KINDS, SPEC)
    assert facts["per_kind"]["v2_builders_explicit"] == dict.fromkeys(KINDS, SPEC)
    assert facts["v2_explicit"]["layers"] == {"mm_prefix": False, "backend": SPEC, "flash_attn_refuses": False}


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
    if pin in V2_DFLASH:
        # Upstream's V1 fix edits the target's own arch config, but the cached flag stays True.
        assert facts["target_after"]["arch_mm_prefix"] is False
        assert facts["v2"]["layers"]["mm_prefix"] is True
        assert facts["v2_explicit"]["builders"]["backend"] == "TRITON_ATTN"
        # The target's per-kind backends reach every drafter layer, over the speculative backend.
        for path in ("v1_dflash_explicit", "v2_layers_explicit", "v2_builders_explicit"):
            assert facts["per_kind"][path] == dict.fromkeys(KINDS, PER_KIND), path
        assert facts["runner"]["use_v2_model_runner"] is True
    else:
        assert facts["per_kind"] is None  # 0.21.0 has no per-kind overrides
