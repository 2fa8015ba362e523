"""Reference attention for the series_a behaviour tests (plain torch, CPU).

``varlen_attention`` follows flash_attn_varlen_func's interface and semantics for the paged case: keys come
from ``k``/``v`` caches through ``block_table`` and ``seqused_k``; causal masks and windows are aligned to the
bottom right (query ``t`` of a sequence sits at key position ``t + seqused_k - seqlen_q``). ``dense_mm_prefix``
is the mask the Triton backend documents, written out per request: ``(causal AND window) OR (query and key in
the same mm range)``, the window optionally clamping the bidirectional part too.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


def _expand_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    return x.repeat_interleave(num_heads // x.shape[1], dim=1)


def varlen_attention(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
    seqused_k: torch.Tensor,
    max_seqlen_k: int,
    causal: bool,
    window_size: Sequence[int] | None,
    block_table: torch.Tensor,
    softmax_scale: float,
    **_: Any,
) -> None:
    left, right = window_size if window_size is not None else (-1, -1)
    block_size = k.shape[1]
    for b in range(block_table.shape[0]):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        n, kv_len = q1 - q0, int(seqused_k[b])
        if n == 0:
            continue
        assert n <= max_seqlen_q and kv_len <= max_seqlen_k
        blocks = block_table[b, : (kv_len + block_size - 1) // block_size]
        keys = k[blocks].reshape(-1, *k.shape[2:])[:kv_len]
        values = v[blocks].reshape(-1, *v.shape[2:])[:kv_len]
        qq = q[q0:q1]
        scores = torch.einsum("qhd,khd->hqk", qq, _expand_heads(keys, qq.shape[1])) * softmax_scale
        pos = torch.arange(n)[:, None] + (kv_len - n)
        j = torch.arange(kv_len)[None, :]
        mask = torch.ones(n, kv_len, dtype=torch.bool)
        if causal:
            mask &= j <= pos
        if left >= 0:
            mask &= j >= pos - left
        if right >= 0:
            mask &= j <= pos + right
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", probs, _expand_heads(values, qq.shape[1]))


def dense_mm_prefix(batch: MMBatch, window: int | None, clamp: bool, scale: float) -> torch.Tensor:
    """Every request's output rows from a full (dense) mask over its keys."""
    outs = []
    for r, (seq_len, q_len) in enumerate(zip(batch.seq_lens, batch.query_lens, strict=True)):
        pos = torch.arange(seq_len - q_len, seq_len)[:, None]
        j = torch.arange(seq_len)[None, :]
        mask = j <= pos
        if window is not None:
            mask &= (pos - j) < window
        for start, end in batch.ranges.get(r, []):
            if start >= end:
                continue
            mm = (pos >= start) & (pos <= end) & (j >= start) & (j <= end)
            if window is not None and clamp:
                mm &= (pos - j) < window
            mask |= mm
        qq = batch.query[batch.query_starts[r] : batch.query_starts[r + 1]]
        keys, values = batch.keys[r][:seq_len], batch.values[r][:seq_len]
        scores = torch.einsum("qhd,khd->hqk", qq, _expand_heads(keys, qq.shape[1])) * scale
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, _expand_heads(values, qq.shape[1])))
    return torch.cat(outs)


@dataclass
class MMBatch:
    """A batch of requests (chunked prefills and decodes) over a paged KV cache, with mm ranges."""

    seq_lens: list[int]
    query_lens: list[int]
    ranges: dict[int, list[tuple[int, int]]]
    query: torch.Tensor
    key_cache: torch.Tensor  # (num_blocks, block_size, num_kv_heads, head_size)
    value_cache: torch.Tensor
    block_table: torch.Tensor
    keys: list[torch.Tensor] = field(default_factory=list)  # per request, contiguous
    values: list[torch.Tensor] = field(default_factory=list)

    @property
    def query_starts(self) -> list[int]:
        starts = [0]
        for n in self.query_lens:
            starts.append(starts[-1] + n)
        return starts


def random_batch(
    rng: random.Random,
    *,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_size: int = 16,
    block_size: int = 8,
    dtype: torch.dtype = torch.float32,
    with_ranges: bool = True,
) -> MMBatch:
    """1-4 requests; each a chunk (prefill, later chunk or decode) of a prompt whose mm ranges may start
    before the chunk, end after it, be degenerate, or be longer than a sliding window."""
    seq_lens, query_lens, ranges = [], [], {}
    for r in range(rng.randint(1, 4)):
        seq_len = rng.randint(1, 64)
        seq_lens.append(seq_len)
        query_lens.append(rng.choice([seq_len, rng.randint(1, seq_len), 1]))
        if not with_ranges:
            continue
        spans, p = [], rng.randint(0, 6)
        while p < seq_len + 12:
            length = rng.choice([0, rng.randint(1, 6), rng.randint(6, 24)])
            spans.append((p, p + length))
            p += length + rng.randint(1, 9)
        ranges[r] = spans
    gen = torch.Generator().manual_seed(rng.randint(0, 2**31))
    total = sum(query_lens)
    query = torch.randn(total, num_heads, head_size, generator=gen, dtype=dtype)
    blocks_per = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(blocks_per) + 3
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_size, generator=gen, dtype=dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_size, generator=gen, dtype=dtype)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    block_table = torch.zeros(len(seq_lens), max(blocks_per), dtype=torch.int32)
    batch = MMBatch(seq_lens, query_lens, ranges, query, key_cache, value_cache, block_table)
    for r, count in enumerate(blocks_per):
        mine, free = free[:count], free[count:]
        block_table[r, :count] = torch.tensor(mine, dtype=torch.int32)
        batch.keys.append(key_cache[mine].reshape(-1, num_kv_heads, head_size))
        batch.values.append(value_cache[mine].reshape(-1, num_kv_heads, head_size))
    return batch


class Recorder:
    """Wraps an attention callable and records each call's keyword arguments."""

    def __init__(self, fn: Callable[..., Any] = varlen_attention) -> None:
        self.fn = fn
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        assert not args, "flash_attn_varlen_func is called with keywords"
        self.calls.append(kwargs)
        return self.fn(**kwargs)

    def summary(self) -> list[dict[str, Any]]:
        """What distinguishes calls: shapes and flags, not tensor values."""
        return [
            {
                "q": list(c["q"].shape),
                "causal": c.get("causal"),
                "window_size": list(c["window_size"]) if c.get("window_size") is not None else None,
                "cu_seqlens_q": [int(x) for x in c["cu_seqlens_q"]],
                "seqused_k": [int(x) for x in c["seqused_k"]],
            }
            for c in self.calls
        ]


def as_mapping(ranges: Mapping[int, Sequence[tuple[int, int]]]) -> dict[int, list[tuple[int, int]]]:
    return {int(k): [(int(a), int(b)) for a, b in v] for k, v in ranges.items()}
