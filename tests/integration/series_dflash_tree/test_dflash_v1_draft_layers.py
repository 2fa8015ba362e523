"""dflash-batched-verification on the V1 runner, run in the patched trees (dflash_v1_probe.py): a Gemma 4 shaped
DFlash drafter (four sliding layers with a window of 64, one full layer, 4 query heads against the target's 2) with
a Gemma 4 26B-A4B shaped target, through the tree's own draft model, KV cache grouping, proposer and metadata
builders, for a Triton and a FlashAttention drafter.

Each test failed on the series' version 1, whose 0005 gave sliding draft layers sliding-window KV specs (five KV
cache groups for five draft layers), turned V1's one-group check off, created the metadata builders before their
layers were named (Triton's took the target's 2 query heads) and sized the query buffers for 42 queries where a
6-request step runs as 48."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.network

Facts = Callable[..., dict[str, Any]]
BACKENDS = ["triton", "flash_attn"]
DRAFT_HEADS, TARGET_HEADS, WINDOW = 4, 2, 64


def _run(v1_facts: Facts, backend: str, pin: str = "vllm-0.21.0", mode: str = "all") -> dict[str, Any]:
    run = v1_facts(pin, mode)[backend]
    assert "error" not in run, run.get("trace")
    return run


@pytest.mark.parametrize("backend", BACKENDS)
def test_sliding_draft_layers_window_the_kernel_on_full_kv(v1_facts: Facts, backend: str) -> None:
    """Finding (c): every draft layer's KV cache is allocated as full attention; the sliding layers' window is
    applied by the attention kernel (FlashAttention / Triton window (W - 1, 0)) and they stay causal."""
    layers = _run(v1_facts, backend)["layers"]
    assert [layer["spec"] for layer in layers] == ["FullAttentionSpec"] * 5
    assert all(layer["spec_window"] is None for layer in layers)
    assert [layer["kernel_window"] for layer in layers] == [[WINDOW - 1, 0]] * 4 + [[-1, -1]]
    assert [layer["causal"] for layer in layers] == [True] * 4 + [False]


@pytest.mark.parametrize("backend", BACKENDS)
def test_draft_layers_make_one_kv_cache_group_of_their_own(v1_facts: Facts, backend: str) -> None:
    """Finding (b): the tree's KV cache grouping (hybrid manager on, as on CUDA) puts all five draft layers in one
    group that holds no target layer, and the proposer's own check accepts it."""
    run = _run(v1_facts, backend)
    with_draft = [g for g in run["grouping"]["groups"] if g["draft_layers"]]
    assert len(with_draft) == 1, with_draft
    (group,) = with_draft
    assert len(group["draft_layers"]) == 5 and group["target_layers"] == 0
    # The target's 25 sliding and 5 full layers still make their own groups beside it.
    assert sum(g["target_layers"] for g in run["grouping"]["groups"]) == 30
    assert run["validate"] == "ok"


@pytest.mark.parametrize("backend", BACKENDS)
def test_proposer_refuses_draft_layers_in_several_groups(v1_facts: Facts, backend: str) -> None:
    """Finding (b): V1's validate_same_kv_cache_group stays on: draft layers split over two KV cache groups (the
    layout sliding-window specs gave) stop the proposer at startup instead of drafting through two block tables."""
    verdict = _run(v1_facts, backend)["validate_split"]
    assert verdict.startswith("AssertionError") and "same kv cache group" in verdict


@pytest.mark.parametrize("backend", BACKENDS)
def test_metadata_builders_are_created_with_their_layers(v1_facts: Facts, backend: str) -> None:
    """Finding (a): one builder per (backend, causality, window), each created with its own layers, in the draft
    layers' KV cache group; Triton's sizes its scratch from the drafter's 4 query heads, not the target's 2."""
    run = _run(v1_facts, backend)
    builders = run["builders"]
    if backend == "triton":
        assert DRAFT_HEADS != TARGET_HEADS
        assert {b["num_heads_q"] for b in builders} == {DRAFT_HEADS}
    assert [(b["causal"], b["windows"], len(b["layers"])) for b in builders] == [
        (True, [str(WINDOW)], 4),
        (False, ["None"], 1),
    ]
    (draft_group,) = [i for i, g in enumerate(run["grouping"]["groups"]) if g["draft_layers"]]
    assert {b["kv_cache_group"] for b in builders} == {draft_group}


@pytest.mark.parametrize(("pin", "mode"), [("vllm-0.21.0", "all"), ("vllm-0.26.0", "padding"),
                                           ("vllm-0.29.0", "padding"), ("vllm-0.33.0", "padding")])
def test_query_buffers_hold_cuda_graph_padded_steps(v1_facts: Facts, pin: str, mode: str) -> None:
    """Finding (d): with max_num_seqs 6, 6 speculative tokens and piecewise CUDA graphs, a 6-request step has 42
    queries and the drafter's dispatcher runs it at the capture size 48; positions and slot mappings must hold 48
    rows. (Full decode graphs round the capture sizes to multiples of 1 + k, which makes 42 one.) The V1 proposers
    of 0.29.0 and 0.33.0 size them themselves (upstream's fix); the 0.21.0 series does it in 0005."""
    padding = _run(v1_facts, "triton", pin, mode)["padding"]
    assert [(p["queries"], p["padded"]) for p in padding][-1] == (42, 48)
    assert all(p["positions"] == p["slot_mapping"] == p["padded"] for p in padding), padding


def test_non_causal_sliding_draft_layers_see_both_sides_of_their_window(v1_facts: Facts) -> None:
    """Third review, 1: a sliding draft layer that is not causal (use_swa, MiMo-style) gets the window on both
    sides, as upstream's 0.26.0 and later (_maybe_symmetrize_window): its block rows see the later block tokens
    inside the window. With the causal (W - 1, 0) window they could not (silent acceptance loss)."""
    run = v1_facts("vllm-0.21.0")["noncausal_sliding"]
    assert "error" not in run, run.get("trace")
    layers = run["layers"]
    assert [(layer["causal"], layer["window"]) for layer in layers] == [(False, WINDOW)] * 2
    assert all(layer["call_windows"] == [[WINDOW - 1, WINDOW - 1]] for layer in layers), layers
    assert max(layer["max_err"] for layer in layers) <= 1e-4


def test_skipping_sliding_layers_from_kv_quantization_keeps_the_drafter_in_one_group(v1_facts: Facts) -> None:
    """Third review, 8: with an fp8 KV cache and --kv-cache-dtype-skip-layers sliding_window, sliding and full draft
    layers must not get different KV dtypes (two specs, two groups, the proposer's assertion). On 0.21.0 the DFlash
    draft layers are built without the cache config (as upstream builds them), so the skip list never reaches them:
    every draft layer keeps the model dtype ("auto"), one spec, one group, and the check passes."""
    run = v1_facts("vllm-0.21.0")["skip_sliding"]
    assert "error" not in run, run.get("trace")
    assert run["dtypes"] == ["auto"] * 5
    assert len(set(run["spec_dtypes"])) == 1
    assert run["groups_with_draft"] == 1
    assert run["validate"] == "ok"
