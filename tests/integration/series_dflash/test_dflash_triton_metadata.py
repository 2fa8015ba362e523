"""The patched Triton attention metadata builder sizes its decode scratch from the group's own KV cache spec: a
Gemma 4 full-attention group (head size 512, 2 KV heads) in a model whose config says 256 / 8 gets 512-wide
buffers. The builder is the tree's real class; its vLLM imports are stand-ins."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.integration.series_dflash.dflash_stubs import patched_modules

pytestmark = pytest.mark.network

MODULE = "vllm.v1.attention.backends.triton_attn"


class BuilderBase:
    """AttentionMetadataBuilder's constructor: it only stores its arguments."""

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: Any) -> None:
        self.kv_cache_spec, self.layer_names, self.vllm_config, self.device = (
            kv_cache_spec,
            layer_names,
            vllm_config,
            device,
        )

    def __class_getitem__(cls, item: Any) -> type:
        return cls


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


OVERRIDES = {
    "vllm.v1.attention.backend.AttentionMetadataBuilder": BuilderBase,
    "vllm.utils.math_utils.next_power_of_2": _next_power_of_2,
    "vllm.utils.math_utils.cdiv": lambda a, b: -(-a // b),
    "vllm.platforms.current_platform": types.SimpleNamespace(
        is_cuda=lambda: False, is_rocm=lambda: False, is_device_capability=lambda cap: False
    ),
    "vllm.v1.attention.backends.utils.get_num_attention_heads_from_layers": lambda vllm_config, names: None,
    "vllm.v1.attention.ops.triton_unified_attention.MAX_3D_QUERY_LEN": 16,
}


def _build(tree: Path) -> Any:
    model_config = types.SimpleNamespace(
        get_num_attention_heads=lambda parallel_config: 16,
        get_num_kv_heads=lambda parallel_config: 8,
        get_head_size=lambda: 256,
        rswa_window=None,
    )
    vllm_config = types.SimpleNamespace(
        model_config=model_config,
        parallel_config=None,
        compilation_config=types.SimpleNamespace(cudagraph_mode=None, cudagraph_capture_sizes=[1, 8, 24]),
        speculative_config=None,
        scheduler_config=types.SimpleNamespace(max_num_seqs=24),
    )
    spec = types.SimpleNamespace(block_size=16, num_kv_heads=2, head_size=512, kv_quant_mode=None)
    overrides = {**OVERRIDES, "vllm.config.get_layers_from_vllm_config": lambda *args, **kwargs: {}}
    with patched_modules(tree, [MODULE], overrides) as mods:
        builder_cls = mods[MODULE].TritonAttentionMetadataBuilder
        return builder_cls(spec, ["model.layers.5.self_attn.attn"], vllm_config, torch.device("cpu"))


def test_scratch_sized_from_kv_cache_spec(patched: Path) -> None:
    builder = _build(patched)
    assert (builder.headdim, builder.num_heads_kv) == (512, 2)
    assert builder.softmax_segm_output.shape[-1] == 512
    assert builder.softmax_segm_output.shape[1] == 16  # query heads: the model's, no layer registered here


def test_unpatched_builder_uses_model_wide_geometry(pristine_021: Path) -> None:
    """Negative control: 0.21.0 as released sizes a 512-dim group's scratch for 256-dim heads."""
    builder = _build(pristine_021)
    assert (builder.headdim, builder.num_heads_kv) == (256, 8)
    assert builder.softmax_segm_output.shape[-1] == 256


def test_query_heads_from_the_groups_layers_on_021(patched_021: Path) -> None:
    """0.21.0 also takes the query head count from the group's registered layers (a drafter's layers need not
    have the target's head count); the largest one sizes the scratch."""
    layers = {
        "draft.0.attn": types.SimpleNamespace(impl=types.SimpleNamespace(num_heads=32)),
        "draft.1.attn": types.SimpleNamespace(impl=types.SimpleNamespace(num_heads=24)),
    }
    model_config = types.SimpleNamespace(
        get_num_attention_heads=lambda parallel_config: 16,
        get_num_kv_heads=lambda parallel_config: 8,
        get_head_size=lambda: 256,
    )
    vllm_config = types.SimpleNamespace(
        model_config=model_config,
        parallel_config=None,
        compilation_config=types.SimpleNamespace(cudagraph_mode=None, cudagraph_capture_sizes=[1, 8, 24]),
    )
    spec = types.SimpleNamespace(block_size=16, num_kv_heads=4, head_size=128, kv_quant_mode=None)
    overrides = {**OVERRIDES, "vllm.config.get_layers_from_vllm_config": lambda *args, **kwargs: layers}
    with patched_modules(patched_021, [MODULE], overrides) as mods:
        builder = mods[MODULE].TritonAttentionMetadataBuilder(spec, list(layers), vllm_config, torch.device("cpu"))
    assert builder.num_heads_q == 32
    assert tuple(builder.softmax_segm_output.shape[1:]) == (32, builder.num_par_softmax_segments, 128)
