"""A FlashAttention layer (a DFlash drafter) and a Triton layer (a Gemma 4 target) of different KV cache groups that
share one raw KV cache tensor must agree on where each block's bytes are. Triton views the tensor as
(num_blocks, 2, block, heads, dim) and FlashAttention as (2, num_blocks, ...): as built, the drafter's block j K/V
lands inside the target's blocks j // 2 and (num_blocks + j) // 2. The patched GPUModelRunner detects the mix
(_shared_kv_tensors_mix_block_dims) and makes the FlashAttention view block-major
(_update_hybrid_attention_mamba_layout), so block j is the bytes [j * page, (j + 1) * page) in both views.

GPUModelRunner, the Triton and FlashAttention backends and the KV cache specs are the pinned tree's own (patched or
pristine 0.21.0), imported for real in the tree's interpreter (tests/integration/series_dflash/in_tree.py); the
runner's methods are called unbound on a minimal ``self``."""

from __future__ import annotations

import importlib
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.integration.series_dflash.in_tree import PATCHED_021, PRISTINE_021, Tree, default_vllm_config, scenario

pytestmark = pytest.mark.network

RUNNER = "vllm.v1.worker.gpu_model_runner"
SPECS = "vllm.v1.kv_cache_interface"
TRITON = "vllm.v1.attention.backends.triton_attn"
FLASH = "vllm.v1.attention.backends.flash_attn"


BLOCK, NUM_BLOCKS, J = 16, 6, 3  # the drafter's block 3 lands in the target's blocks 1 and 4 without the fix
TARGET_LAYER, DRAFT_LAYER = "model.language_model.layers.0.self_attn.attn", "model.layers.0.self_attn.attn"


def _load() -> dict[str, Any]:
    """The tree's own classes (in its interpreter)."""
    return {
        "runner": importlib.import_module(RUNNER).GPUModelRunner,
        "full": importlib.import_module(SPECS).FullAttentionSpec,
        "triton": importlib.import_module(TRITON).TritonAttentionBackend,
        "flash": importlib.import_module(FLASH).FlashAttentionBackend,
    }


def _specs(full: Any) -> tuple[Any, Any]:
    """Target (1 KV head of 128) and drafter (2 KV heads of 64): different geometry, one page size."""
    target = full(block_size=BLOCK, num_kv_heads=1, head_size=128, dtype=torch.bfloat16)
    draft = full(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    assert target.page_size_bytes == draft.page_size_bytes
    return target, draft


def _group(gid: int, backend: Any, spec: Any, layers: list[str]) -> Any:
    """The fields of vllm.v1.worker.utils.AttentionGroup that the runner's KV cache code reads."""
    return types.SimpleNamespace(kv_cache_group_id=gid, backend=backend, kv_cache_spec=spec, layer_names=layers)


def _fake_runner(groups: list[Any]) -> Any:
    return types.SimpleNamespace(
        _kv_cache_spec_attn_group_iterator=lambda: iter(groups),
        runner_only_attn_layers=set(),
        cache_config=types.SimpleNamespace(cache_dtype="auto"),
    )


def _mixed(v: dict[str, Any], draft_backend: str = "flash") -> list[Any]:
    target, draft = _specs(v["full"])
    return [_group(0, v["triton"], target, [TARGET_LAYER]), _group(1, v[draft_backend], draft, [DRAFT_LAYER])]


def _view(raw: torch.Tensor, backend: Any, spec: Any) -> torch.Tensor:
    """What _reshape_kv_cache_tensors builds for one attention layer (no page padding)."""
    num_blocks = raw.numel() // spec.page_size_bytes
    shape = backend.get_kv_cache_shape(num_blocks, BLOCK, spec.num_kv_heads, spec.head_size, cache_dtype_str="auto")
    with default_vllm_config():  # the KV cache layout is read from the current config
        order = backend.get_kv_cache_stride_order()
    inv_order = [order.index(i) for i in range(len(order))]
    return raw.view(spec.dtype).view(tuple(shape[i] for i in order)).permute(*inv_order)


def _shared_views(v: dict[str, Any], groups: list[Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    page = groups[0].kv_cache_spec.page_size_bytes
    raw = torch.randint(-128, 128, (NUM_BLOCKS * page,), dtype=torch.int8)
    kv_caches = {g.layer_names[0]: _view(raw, g.backend, g.kv_cache_spec) for g in groups}
    return raw, kv_caches


def _write_draft_block(kv_caches: dict[str, torch.Tensor]) -> tuple[set[int], list[int]]:
    """Fill the drafter's block J (K and V) with a marker; return the raw byte offsets that changed and the target
    (Triton) blocks whose contents changed."""
    target_before = kv_caches[TARGET_LAYER].view(torch.int16).clone()  # bits: random bytes include NaNs
    storage = kv_caches[DRAFT_LAYER].untyped_storage()  # the shared raw tensor's bytes
    storage_before = bytes(storage)
    kv_caches[DRAFT_LAYER][0, J].fill_(7.0)
    kv_caches[DRAFT_LAYER][1, J].fill_(-7.0)
    storage_after = bytes(storage)
    changed = {i for i, (a, b) in enumerate(zip(storage_before, storage_after, strict=True)) if a != b}
    target_after = kv_caches[TARGET_LAYER].view(torch.int16)
    blocks = [b for b in range(NUM_BLOCKS) if not torch.equal(target_before[b], target_after[b])]
    return changed, blocks


@scenario(PATCHED_021)
def block_dim_mix(tree: Path) -> dict[str, Any]:
    """What the patched runner's _shared_kv_tensors_mix_block_dims says for mixed, same and unshared backends."""
    v = _load()
    runner = v["runner"]
    groups = _mixed(v)
    raw, _ = _shared_views(v, groups)
    shared = {TARGET_LAYER: raw, DRAFT_LAYER: raw}
    same = _mixed(v, draft_backend="triton")
    own = {TARGET_LAYER: raw, DRAFT_LAYER: raw.clone()}
    single = [_group(0, v["flash"], groups[1].kv_cache_spec, [DRAFT_LAYER])]
    check = runner._shared_kv_tensors_mix_block_dims
    return {
        "own_method": "_shared_kv_tensors_mix_block_dims" in vars(runner),  # the tree's own, not inherited
        "triton_block_dim": v["triton"].get_kv_cache_block_dim(BLOCK, 1, 128),
        "flash_block_dim": v["flash"].get_kv_cache_block_dim(BLOCK, 2, 64),
        "mixed": check(_fake_runner(groups), shared, [BLOCK, BLOCK]),
        "both_triton": check(_fake_runner(same), shared, [BLOCK, BLOCK]),
        "not_shared": check(_fake_runner(groups), own, [BLOCK, BLOCK]),
        "single_group": check(_fake_runner(single), {DRAFT_LAYER: raw}, [BLOCK]),
    }


def test_mix_of_block_dims_is_detected(patched_021: Tree) -> None:
    got = patched_021.result(block_dim_mix)
    assert got["own_method"]
    assert (got["triton_block_dim"], got["flash_block_dim"]) == (0, 1)
    assert got["mixed"] is True
    assert got["both_triton"] is False  # one block dim, nothing to fix
    assert got["not_shared"] is False  # mixed backends, but each layer with its own raw tensor
    assert got["single_group"] is False


@scenario(PATCHED_021)
def layout_update(tree: Path) -> dict[str, Any]:
    """The patched runner's _update_hybrid_attention_mamba_layout on shared views, then a write to draft block J."""
    v = _load()
    groups = _mixed(v)
    page = groups[0].kv_cache_spec.page_size_bytes
    raw, kv_caches = _shared_views(v, groups)
    shape = kv_caches[DRAFT_LAYER].shape
    v["runner"]._update_hybrid_attention_mamba_layout(_fake_runner(groups), kv_caches, [BLOCK, BLOCK])
    draft, target = kv_caches[DRAFT_LAYER], kv_caches[TARGET_LAYER]
    facts = {
        "page": page,
        "shape_kept": draft.shape == shape,
        "same_storage": draft.data_ptr() == raw.data_ptr(),
        "draft_block_stride_bytes": draft.stride(1) * draft.element_size(),
        "target_contiguous": target.stride() == torch.empty(target.shape).stride(),
    }
    changed, target_blocks = _write_draft_block(kv_caches)
    target_j = kv_caches[TARGET_LAYER][J].reshape(-1)
    return {**facts, "changed": sorted(changed), "target_blocks": target_blocks, "target_j": target_j.clone()}


def test_draft_block_writes_stay_in_their_page_after_the_layout_update(patched_021: Tree) -> None:
    got = patched_021.result(layout_update)
    page = got["page"]
    assert got["shape_kept"] and got["same_storage"]
    assert got["draft_block_stride_bytes"] == page  # one block per page
    assert got["target_contiguous"]  # the target's view is untouched
    changed = got["changed"]
    assert changed and min(changed) >= J * page and max(changed) < (J + 1) * page
    assert got["target_blocks"] == [J]
    # The drafter's block J is exactly the target's block J: its K half then its V half.
    target_j = got["target_j"]
    half = target_j.numel() // 2
    assert torch.all(target_j[:half] == 7.0) and torch.all(target_j[half:] == -7.0)


@scenario(PATCHED_021)
def views_as_built(tree: Path) -> dict[str, Any]:
    """A write to draft block J through the views as first built (no layout update)."""
    v = _load()
    groups = _mixed(v)
    _, kv_caches = _shared_views(v, groups)
    changed, target_blocks = _write_draft_block(kv_caches)
    return {"page": groups[0].kv_cache_spec.page_size_bytes, "changed": sorted(changed), "target_blocks": target_blocks}


def test_without_the_layout_update_draft_writes_corrupt_other_target_blocks(patched_021: Tree) -> None:
    """Control: the views as first built (what 0.21.0 keeps) reproduce the corruption seen on the H100."""
    got = patched_021.result(views_as_built)
    page = got["page"]
    assert any(not J * page <= i < (J + 1) * page for i in got["changed"])
    assert got["target_blocks"] == sorted({J // 2, (NUM_BLOCKS + J) // 2}) and J not in got["target_blocks"]


@scenario(PRISTINE_021)
def runner_methods(tree: Path) -> dict[str, bool]:
    runner = _load()["runner"]
    # vars(): the runner's own class body, not what it inherits.
    return {name: name in vars(runner) for name in ("_shared_kv_tensors_mix_block_dims",
                                                    "_update_hybrid_attention_mamba_layout")}


def test_pristine_runner_has_no_check(pristine_021: Tree) -> None:
    """0.21.0 as released only relayouts attention + Mamba hybrids: the mixed Triton / FlashAttention case has the
    bug."""
    got = pristine_021.result(runner_methods)
    assert got == {"_shared_kv_tensors_mix_block_dims": False, "_update_hybrid_attention_mamba_layout": True}


def _reshape(v: dict[str, Any], groups: list[Any], raw: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tree's own _reshape_kv_cache_tensors on one shared raw tensor; the runner methods it calls on ``self``
    are the tree's own, bound to the minimal runner."""
    runner_cls, fake = v["runner"], _fake_runner(groups)
    for name in ("_shared_kv_tensors_mix_block_dims", "_update_hybrid_attention_mamba_layout"):
        if name in vars(runner_cls):
            setattr(fake, name, types.MethodType(vars(runner_cls)[name], fake))
    with default_vllm_config():
        kv_caches: dict[str, torch.Tensor] = runner_cls._reshape_kv_cache_tensors(
            fake, {TARGET_LAYER: raw, DRAFT_LAYER: raw}, [BLOCK, BLOCK]
        )
    return kv_caches


@scenario(PATCHED_021, PRISTINE_021)
def reshape_end_to_end(tree: Path) -> dict[str, Any]:
    """The tree's whole _reshape_kv_cache_tensors on one shared raw tensor, then a write to draft block J."""
    v = _load()
    groups = _mixed(v)
    page = groups[0].kv_cache_spec.page_size_bytes
    raw = torch.randint(-128, 128, (NUM_BLOCKS * page,), dtype=torch.int8)
    kv_caches = _reshape(v, groups, raw)
    shapes = {k: tuple(t.shape) for k, t in kv_caches.items()}
    changed, target_blocks = _write_draft_block(kv_caches)
    return {"page": page, "shapes": shapes, "changed": sorted(changed), "target_blocks": target_blocks}


@pytest.mark.parametrize("tree", ["patched", "pristine"])
def test_reshape_kv_cache_tensors_end_to_end(tree: str, request: pytest.FixtureRequest) -> None:
    """Through the whole reshape: the patched runner keeps the drafter's block J in page J; 0.21.0 as released
    writes it over the target's blocks J // 2 and (num_blocks + J) // 2."""
    got = request.getfixturevalue("patched_021" if tree == "patched" else "pristine_021").result(reshape_end_to_end)
    page = got["page"]
    assert got["shapes"] == {
        TARGET_LAYER: (NUM_BLOCKS, 2, BLOCK, 1, 128),
        DRAFT_LAYER: (2, NUM_BLOCKS, BLOCK, 2, 64),
    }
    if tree == "patched":
        assert min(got["changed"]) >= J * page and max(got["changed"]) < (J + 1) * page
        assert got["target_blocks"] == [J]
    else:
        assert got["target_blocks"] == [J // 2, (NUM_BLOCKS + J) // 2]
