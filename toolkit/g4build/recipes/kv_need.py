"""The KV cache vLLM insists on before it starts: one request of max-model-len, sized as vLLM sizes it.

vLLM refuses to start when its KV room cannot hold one request of ``max-model-len`` tokens (v0.21.0,
``vllm/v1/core/kv_cache_utils.py``: ``_check_enough_kv_cache_memory`` over ``_max_memory_usage_bytes_from_groups``),
and its error names the longest context that would fit. The amount is not tokens x bytes per token:

- a sliding-window layer holds ``window - 1 + max-num-batched-tokens`` tokens (a prefill chunk beside the
  window), never more than ``max-model-len``, plus one block, since a window need not start on a block boundary
  (``SlidingWindowSpec.max_admission_blocks_per_request``); a full layer holds ``max-model-len`` rounded up to
  its block;
- every layer's page is the model's largest page (``unify_kv_cache_spec_page_size``: a layer with smaller pages
  gets proportionally more tokens per block);
- layers of one kind form groups of equal size, the last group of a kind padded with empty layers: the group
  size is the smallest kind's count, or the largest's where that is under 1.5 times the smallest
  (``_get_kv_cache_groups_uniform_page_size``);
- a drafter's attention layers are part of the model: DFlash under dflash-batched-verification on the pins in
  ``DFLASH_SLIDING_AS_FULL_PINS`` allocates its sliding layers as full attention (its patch
  ``0005-dflash-sliding-window-draft-layers``: one block table for every draft layer), while Gemma 4's MTP
  assistant reads the target's cache and holds none of its own.

With max-num-batched-tokens 32768 a sliding layer of window 1024 holds 33,791 tokens, so Gemma 4 26B-A4B's 25
sliding layers outweigh its 5 full ones even at 131072 tokens. vLLM on an H200 said 11.45 GiB for the DFlash
recipe at 131072 and an estimated longest context of 5360 at 1.23 GiB (tests/gpu/results/
vllm-0.21.0-card-fit.json); ``tests/unit/recipes/test_kv_need.py`` holds this arithmetic to both.
"""

from __future__ import annotations

from dataclasses import dataclass

from g4build.recipes.model import KvGeometry

BLOCK_SIZE = 16  # vLLM's default --block-size, the block of the layers with the largest page
GROUP_SPREAD = 1.5  # vLLM's heuristic: the largest kind's count is the group size when under 1.5 x the smallest's
# pins whose dflash-batched-verification allocates a DFlash drafter's sliding layers as full attention
DFLASH_SLIDING_AS_FULL_PINS = ("vllm-0.21.0",)


@dataclass(frozen=True, kw_only=True)
class LayerKind:
    """Attention layers that share one KV cache spec: same heads, head dim and window (0: full attention)."""

    kv_heads: int
    head_dim: int
    window: int
    count: int

    def token_bytes(self, dtype_bytes: int) -> int:
        return 2 * self.kv_heads * self.head_dim * dtype_bytes  # K and V


def layer_kinds(target: KvGeometry, drafter: KvGeometry | None = None, *,
                drafter_sliding_as_full: bool = False) -> list[LayerKind]:
    """The kinds of KV-holding layers of a target and its drafter, merged where vLLM's specs would be equal."""
    raw: list[tuple[int, int, int, int]] = []
    for geometry, as_full in ((target, False), (drafter, drafter_sliding_as_full)):
        if geometry is None:
            continue
        raw.append((geometry.full_kv_heads, geometry.full_head_dim, 0, geometry.full_layers))
        window = 0 if as_full or not geometry.sliding_window else geometry.sliding_window
        raw.append((geometry.sliding_kv_heads, geometry.sliding_head_dim, window, geometry.sliding_layers))
    merged: dict[tuple[int, int, int], int] = {}
    for heads, dim, window, count in raw:
        if count and heads and dim:
            merged[(heads, dim, window)] = merged.get((heads, dim, window), 0) + count
    return [LayerKind(kv_heads=h, head_dim=d, window=w, count=c) for (h, d, w), c in merged.items()]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _held(kind: LayerKind, per_block: int, max_model_len: int, max_num_batched_tokens: int) -> int:
    """Blocks one layer of this kind holds for one request of max_model_len tokens."""
    if kind.window:
        return _cdiv(min(kind.window - 1 + max_num_batched_tokens, max_model_len), per_block) + 1
    return _cdiv(max_model_len, per_block)


def need_bytes(kinds: list[LayerKind], max_model_len: int, max_num_batched_tokens: int, dtype_bytes: int,
               block_size: int = BLOCK_SIZE) -> int:
    """Bytes of KV cache vLLM requires before it starts: one request of max_model_len tokens, every layer."""
    if not kinds:
        return 0
    if len({k.window for k in kinds}) == 1:
        # one attention type (all full, or all sliding with one window): one group of per-layer specs, each at
        # its own page, nothing unified or padded (kv_cache_utils.py, the uniform-type path)
        return sum(k.count * _held(k, block_size, max_model_len, max_num_batched_tokens)
                   * k.token_bytes(dtype_bytes) * block_size for k in kinds)
    page = max(k.token_bytes(dtype_bytes) for k in kinds) * block_size
    group_size = min(k.count for k in kinds)
    if max(k.count for k in kinds) < group_size * GROUP_SPREAD:
        group_size = max(k.count for k in kinds)
    blocks = 0
    for kind in kinds:
        per_block = page // kind.token_bytes(dtype_bytes)  # tokens a block of this kind holds
        if per_block * kind.token_bytes(dtype_bytes) != page:
            raise ValueError(f"a page of {page} bytes is not a whole number of {kind.token_bytes(dtype_bytes)}-byte "
                             "tokens: vLLM cannot unify these layers' pages either")
        blocks += _cdiv(kind.count, group_size) * _held(kind, per_block, max_model_len, max_num_batched_tokens)
    return group_size * page * blocks


def longest_context(kinds: list[LayerKind], available_bytes: int, max_model_len: int, max_num_batched_tokens: int,
                    dtype_bytes: int, block_size: int = BLOCK_SIZE) -> int:
    """The longest max-model-len whose one request fits in available_bytes (0: not one token), as vLLM's
    "estimated maximum model length": the same binary search up to max_model_len."""
    def fits(length: int) -> bool:
        return need_bytes(kinds, length, max_num_batched_tokens, dtype_bytes, block_size) <= available_bytes

    low, high, best = 1, max_model_len, 0
    while low <= high:
        mid = (low + high) // 2
        if fits(mid):
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return best
