"""The patched Triton attention metadata builder sizes its decode scratch from the group's own KV cache spec: a
Gemma 4 full-attention group (head size 512, 2 KV heads) in a model whose config says 256 / 8 gets 512-wide
buffers. The builder and everything it calls are the tree's own, run in the tree's interpreter
(tests/integration/series_dflash/in_tree.py); only the model config and KV cache spec are small stand-ins."""

from __future__ import annotations

import importlib
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.integration.series_dflash.in_tree import PATCHED, PATCHED_021, PRISTINE_021, Tree, scenario

pytestmark = pytest.mark.network

MODULE = "vllm.v1.attention.backends.triton_attn"


def _vllm_config(static_forward_context: dict[str, Any]) -> Any:
    """A model whose config says 16 query heads, 8 KV heads of 256; the registered layers (the forward context
    the tree's get_layers_from_vllm_config reads) as given."""
    model_config = types.SimpleNamespace(
        get_num_attention_heads=lambda parallel_config: 16,
        get_num_kv_heads=lambda parallel_config: 8,
        get_head_size=lambda: 256,
        rswa_window=None,
    )
    return types.SimpleNamespace(
        model_config=model_config,
        parallel_config=None,
        compilation_config=types.SimpleNamespace(
            cudagraph_mode=None, cudagraph_capture_sizes=[1, 8, 24], static_forward_context=static_forward_context
        ),
        speculative_config=None,
        scheduler_config=types.SimpleNamespace(max_num_seqs=24),
    )


def _scratch(builder: Any) -> dict[str, Any]:
    return {
        "headdim": builder.headdim,
        "num_heads_kv": builder.num_heads_kv,
        "num_heads_q": builder.num_heads_q,
        "segments": builder.num_par_softmax_segments,
        "softmax_segm_output": tuple(builder.softmax_segm_output.shape),
    }


@scenario(PATCHED, PRISTINE_021)
def full_attention_group(tree: Path) -> dict[str, Any]:
    """The builder for a 512-dim, 2-KV-head group; no layer registered."""
    spec = types.SimpleNamespace(block_size=16, num_kv_heads=2, head_size=512, kv_quant_mode=None)
    builder = importlib.import_module(MODULE).TritonAttentionMetadataBuilder(
        spec, ["model.layers.5.self_attn.attn"], _vllm_config({}), torch.device("cpu")
    )
    return _scratch(builder)


def test_scratch_sized_from_kv_cache_spec(patched: Tree) -> None:
    got = patched.result(full_attention_group)
    assert (got["headdim"], got["num_heads_kv"]) == (512, 2)
    assert got["softmax_segm_output"][-1] == 512
    assert got["softmax_segm_output"][1] == 16  # query heads: the model's, no layer registered here


def test_unpatched_builder_uses_model_wide_geometry(pristine_021: Tree) -> None:
    """Negative control: 0.21.0 as released sizes a 512-dim group's scratch for 256-dim heads."""
    got = pristine_021.result(full_attention_group)
    assert (got["headdim"], got["num_heads_kv"]) == (256, 8)
    assert got["softmax_segm_output"][-1] == 256


@scenario(PATCHED_021)
def drafter_group(tree: Path) -> dict[str, Any]:
    """The builder for a group of two registered drafter layers with 32 and 24 query heads."""
    base = importlib.import_module("vllm.model_executor.layers.attention_layer_base").AttentionLayerBase

    class DraftLayer(base):  # type: ignore[misc,valid-type]
        """A registered attention layer, as far as the builder looks at it (its impl's head count)."""

        def __init__(self, num_heads: int) -> None:
            self.impl = types.SimpleNamespace(num_heads=num_heads)

        def get_attn_backend(self) -> Any:
            raise NotImplementedError

        def get_kv_cache_spec(self, vllm_config: Any) -> Any:
            raise NotImplementedError

    layers = {"draft.0.attn": DraftLayer(32), "draft.1.attn": DraftLayer(24), "target.0.attn": DraftLayer(64)}
    spec = types.SimpleNamespace(block_size=16, num_kv_heads=4, head_size=128, kv_quant_mode=None)
    builder = importlib.import_module(MODULE).TritonAttentionMetadataBuilder(
        spec, ["draft.0.attn", "draft.1.attn"], _vllm_config(layers), torch.device("cpu")
    )
    return _scratch(builder)


def test_query_heads_from_the_groups_layers_on_021(patched_021: Tree) -> None:
    """0.21.0 also takes the query head count from the group's registered layers (a drafter's layers need not
    have the target's head count); the largest one of the group sizes the scratch."""
    got = patched_021.result(drafter_group)
    assert got["num_heads_q"] == 32
    assert got["softmax_segm_output"][1:] == (32, got["segments"], 128)
