"""Which FlashAttention 2 kernel vLLM's ``varlen_fwd`` launches, per shape and GPU: a model of the dispatch.

Read from vllm-flash-attn's FA2 sources (``csrc/flash_attn/flash_api.cpp`` ``mha_varlen_fwd``/``run_mha_fwd``,
``src/flash_fwd_launch_template.h``, ``src/kernel_traits.h``) at the commit vLLM 0.21.0 pins (f5bc33c), and at the
newest commit readable here for the later pins (see ``DISPATCH_NOTES``). The proxy run (``proxy_run.py``) logs what
the built library really launched and checks it against this model, so a wrong reading shows up as a mismatch.

The model answers, for one call: the kernel family (``fwd``, ``splitkv`` or ``splitkv`` + ``combine``), the tile
(kBlockM x kBlockN, warps), the template flags that pick the instantiation, the dynamic shared memory, the split
count, and whether it fits a GPU's opt-in shared memory per block.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

# A GPU as FA2's dispatch sees it: compute capability, SM count and the shared-memory attributes it queries.
# sm_120/121: 99 KiB opt-in per block and 100 KiB per SM (CUDA programming guide, compute capability 12.x table),
# like sm_86/89; H100: 227 KiB per block, 228 KiB per SM.


@dataclass(frozen=True)
class Gpu:
    name: str
    cc: tuple[int, int]
    num_sm: int
    smem_per_block_optin: int
    smem_per_sm: int


GPUS: dict[str, Gpu] = {
    "h100": Gpu("H100 SXM (the machine the proxy runs on)", (9, 0), 132, 232448, 233472),
    "rtx5090": Gpu("RTX 5090 (GB202, sm_120)", (12, 0), 170, 101376, 102400),
    "rtxpro6000": Gpu("RTX PRO 6000 Blackwell (GB202, sm_120)", (12, 0), 188, 101376, 102400),
    "gb10": Gpu("DGX Spark GB10 (sm_121)", (12, 1), 48, 101376, 102400),
}

# The imitated GPUs the proxy forces (the H100 runs once more unmodified).
FORCED = ("rtx5090", "gb10")

DISPATCH_NOTES = [
    "vLLM's FlashAttention backend always passes block_table (paged KV), and mha_varlen_fwd then calls "
    "run_mha_fwd(params, stream, force_split_kernel=paged_KV): every call vLLM makes runs the split-KV kernel, "
    "whose tile is fixed per head size (kBlockM 64; kBlockN 256 for d<=64, 128 for d<=128, else 64; 4 warps) and "
    "does not depend on the GPU. The GPU-dependent branches (is_sm8x for d 96/128, the smem query for d 256) are "
    "in the non-paged run_mha_fwd_ path only.",
    "The one GPU-dependent choice on vLLM's path is num_splits: only when seqlenq_ngroups_swapped (max_seqlen_q == "
    "1, GQA, no window, no ALiBi), from num_splits_heuristic(batch*heads*m_blocks, 2*num_SMs, n_blocks, 128); "
    "splits > 1 add the combine kernel (no dynamic shared memory).",
    "vLLM passes cu_seqlens_k as torch.empty_like(cu_seqlens_q) (uninitialised) together with seqused_k; with a "
    "block table the kernels take K/V rows from the table and the length from seqused_k.",
    "Later commits (the newest readable here, 617264c, 2026-08; vLLM 0.33.0 pins b273a02, not readable here) add "
    "run_mha_fwd_splitkv_align for num_splits == 1 passed explicitly: kBlockN 128 for d<=64, else 64. vLLM's FA2 "
    "path passes num_splits 0 (heuristic) unless batch invariance asks for 1.",
]


def kernel_smem(hdim: int, block_m: int, block_n: int) -> int:
    """Flash_fwd_kernel_traits::kSmemSize for 2-byte elements without Q/K sharing: Q tile + K and V tiles."""
    return block_m * hdim * 2 + 2 * block_n * hdim * 2


def round_hdim(d: int) -> int:
    for k in (32, 64, 96, 128, 192, 256):
        if d <= k:
            return k
    raise ValueError(f"FA2 serves head sizes <= 256, not {d}")


def splitkv_block_n(hdim: int) -> int:
    return 256 if hdim <= 64 else (128 if hdim <= 128 else 64)


def num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
    """flash_api.cpp's heuristic, written from its description: the smallest split count whose wave efficiency is
    within 85% of the best among split counts that change the blocks per split."""
    if batch_nheads_mblocks >= 0.8 * num_sms:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)

    def ceildiv(a: int, b: int) -> int:
        return (a + b - 1) // b

    def eligible(n: int) -> bool:
        return n == 1 or ceildiv(num_n_blocks, n) != ceildiv(num_n_blocks, n - 1)

    efficiency: list[float] = []
    best = 0.0
    for n in range(1, max_splits + 1):
        if not eligible(n):
            efficiency.append(0.0)
            continue
        waves = batch_nheads_mblocks * n / num_sms
        eff = waves / -(-waves // 1)
        best = max(best, eff)
        efficiency.append(eff)
    for n in range(1, max_splits + 1):
        if eligible(n) and efficiency[n - 1] >= 0.85 * best:
            return n
    return 1


@dataclass(frozen=True)
class Shape:
    """One varlen_fwd call as vLLM makes it."""

    name: str
    what: str
    hdim: int
    heads: int
    kv_heads: int
    q_lens: tuple[int, ...]
    k_lens: tuple[int, ...]
    causal: bool
    window: tuple[int, int] = (-1, -1)
    block_size: int = 16
    dtype: str = "bfloat16"
    softcap: float = 0.0
    padded_rows: int = 0  # CUDA-graph padding: rows with no query and no keys appended to the batch
    garbage_cu_seqlens_k: bool = False  # fill vLLM's uninitialised cu_seqlens_k with huge values

    @property
    def batch(self) -> int:
        return len(self.q_lens) + self.padded_rows


def select(shape: Shape, gpu: Gpu) -> dict[str, Any]:
    """What FA2 launches for ``shape`` on ``gpu`` (paged KV: vLLM's path)."""
    hdim = round_hdim(shape.hdim)
    max_q = max(shape.q_lens)
    max_k = max(shape.k_lens)
    left, right = shape.window
    causal = shape.causal
    # mha_varlen_fwd's and set_params_fprop's normalisation of the flags, in their order.
    if max_q == 1:
        causal = False
    if causal:
        right = 0
    swapped = max_q == 1 and shape.heads > shape.kv_heads and left < 0 and right < 0
    if left >= max_k:
        left = -1
    if right >= max_k:
        right = -1
    causal = left < 0 and right == 0  # set_params_fprop: is_causal comes from the window
    local = (left >= 0 or right >= 0) and not causal
    heads = shape.kv_heads if swapped else shape.heads
    q_rows = shape.heads // shape.kv_heads if swapped else max_q
    block_m, warps = 64, 4
    block_n = splitkv_block_n(hdim)
    num_splits = 1
    if swapped:
        n_blocks = -(-max_k // block_n)
        m_blocks = -(-q_rows // 64)
        num_splits = num_splits_heuristic(shape.batch * heads * m_blocks, gpu.num_sm * 2, n_blocks, 128)
    smem = kernel_smem(hdim, block_m, block_n)
    return {
        "family": "splitkv" + ("+combine" if num_splits > 1 else ""),
        "hdim": hdim,
        "block_m": block_m,
        "block_n": block_n,
        "warps": warps,
        "causal": causal,
        "local": local,
        "even_k": shape.hdim == hdim,
        "softcap": shape.softcap > 0,
        "split": num_splits > 1,
        "num_splits": num_splits,
        "seqlenq_ngroups_swapped": swapped,
        "smem_dynamic": smem,
        "fits": smem <= gpu.smem_per_block_optin,
        "smem_headroom": gpu.smem_per_block_optin - smem,
    }


def nonpaged_fwd_tile(hdim: int, causal: bool, gpu: Gpu) -> tuple[int, int, int]:
    """run_mha_fwd_'s tile for the non-paged, unsplit path (not vLLM's; kept to show where the GPU matters)."""
    sm8x = gpu.cc[0] == 8 and gpu.cc[1] > 0
    if hdim == 32 or hdim == 64:
        return 128, 128, 4
    if hdim in (96, 128):
        if sm8x:
            return (64, 64, 4) if causal else ((128, 64, 4) if hdim == 96 else (128, 32, 4))
        return 128, 64, 4
    if hdim == 192:
        return 128, 64, 8
    big = 2 * hdim * (128 + 2 * 64)
    if gpu.smem_per_block_optin >= big and gpu.smem_per_sm < 4 * hdim * (64 + 2 * 64):
        return 128, 64, 8
    return 64, 64, 4


# Gemma 4 DFlash drafters (z-lab, qwen3 layout): head_dim 128; the 31B drafter has 64 query / 8 KV heads, sliding
# window 2048 on all but its last layer, 16-token draft blocks. Gemma 4's own sliding layers: head_dim 256
# (26B-A4B: 16 query / 8 KV heads, window 1024); its 512-dim full layers cannot run on FA2 (d <= 256).
W = 2048
CTX = (37, 611, 2100, 4133)  # context lengths: short, one block table page run, past the window, several windows
SHAPES: list[Shape] = [
    Shape(
        "draft_full_bf16",
        "DFlash draft full layer, 4 requests x 16 query tokens, non-causal",
        128,
        64,
        8,
        (16,) * 4,
        tuple(c + 16 for c in CTX),
        causal=False,
    ),
    Shape(
        "draft_full_fp16",
        "the same in fp16",
        128,
        64,
        8,
        (16,) * 4,
        tuple(c + 16 for c in CTX),
        causal=False,
        dtype="float16",
    ),
    Shape(
        "draft_full_block32",
        "draft full layer, KV block size 32 (hybrid page alignment)",
        128,
        64,
        8,
        (16,) * 4,
        tuple(c + 16 for c in CTX),
        causal=False,
        block_size=32,
    ),
    Shape(
        "draft_full_block64",
        "draft full layer, KV block size 64",
        128,
        64,
        8,
        (16,) * 4,
        tuple(c + 16 for c in CTX),
        causal=False,
        block_size=64,
    ),
    Shape(
        "draft_sliding_noncausal",
        "DFlash draft sliding layer as vLLM hands it: non-causal, window (W-1, 0)",
        128,
        64,
        8,
        (16,) * 4,
        tuple(c + 16 for c in CTX),
        causal=False,
        window=(W - 1, 0),
    ),
    Shape(
        "draft_sliding_causal",
        "draft sliding layer, causal with window (W-1, 0)",
        128,
        64,
        8,
        (16,) * 4,
        tuple(c + 16 for c in CTX),
        causal=True,
        window=(W - 1, 0),
    ),
    Shape(
        "draft_gqa4", "drafter with GQA 4 (32/8 heads)", 128, 32, 8, (16,) * 4, tuple(c + 16 for c in CTX), causal=False
    ),
    Shape("draft_mha", "drafter without GQA (8/8 heads)", 128, 8, 8, (16,) * 3, (53, 700, 2200), causal=False),
    Shape(
        "draft_k6_block",
        "k=6 verification blocks (7 query tokens), 6 requests",
        128,
        64,
        8,
        (7,) * 6,
        (20, 90, 400, 1300, 2049, 3000),
        causal=False,
    ),
    Shape(
        "draft_graph_padded",
        "17 requests padded to 24 for a CUDA graph (7 rows without queries or keys)",
        128,
        64,
        8,
        (16,) * 17,
        tuple(40 + 97 * i for i in range(17)),
        causal=False,
        padded_rows=7,
    ),
    Shape(
        "draft_garbage_cu_k",
        "draft full layer with vLLM's unused cu_seqlens_k filled with huge values",
        128,
        64,
        8,
        (16,) * 4,
        tuple(c + 16 for c in CTX),
        causal=False,
        garbage_cu_seqlens_k=True,
    ),
    Shape(
        "target_sliding_prefill",
        "Gemma 4 sliding layer (d 256, 16/8 heads), causal, window (1023, 0), prefill chunks",
        256,
        16,
        8,
        (300, 64, 1),
        (300, 1500, 2300),
        causal=True,
        window=(1023, 0),
    ),
    Shape(
        "target_sliding_decode",
        "Gemma 4 sliding layer decode (q 1), window (1023, 0)",
        256,
        16,
        8,
        (1,) * 5,
        (5, 800, 1025, 1900, 3000),
        causal=True,
        window=(1023, 0),
    ),
    Shape(
        "target_mm_prefix_noncausal",
        "Gemma 4 sliding layer, the non-causal call over image ranges (mm-prefix recompute)",
        256,
        16,
        8,
        (280, 280),
        (280, 600),
        causal=False,
    ),
    Shape(
        "target_sliding_fp16",
        "Gemma 4 sliding layer in fp16",
        256,
        16,
        8,
        (300, 64),
        (300, 1500),
        causal=True,
        window=(1023, 0),
        dtype="float16",
    ),
    Shape(
        "decode_gqa_split",
        "decode (q 1) with GQA and no window: the split-KV heuristic uses the SM count",
        128,
        32,
        4,
        (1,) * 2,
        (3000, 9000),
        causal=True,
    ),
    Shape("decode_gqa_split_d256", "the same at head size 256", 256, 16, 8, (1,) * 2, (3000, 9000), causal=True),
]


def table() -> dict[str, Any]:
    """Per shape: what each GPU selects (and whether it fits)."""
    rows = []
    for shape in SHAPES:
        per_gpu = {key: select(shape, gpu) for key, gpu in GPUS.items()}
        rows.append({"shape": dataclasses.asdict(shape), "selected": per_gpu})
    return {
        "gpus": {key: dataclasses.asdict(gpu) for key, gpu in GPUS.items()},
        "notes": DISPATCH_NOTES,
        "nonpaged_fwd_tiles": {
            key: {
                f"d{d}_{'causal' if c else 'noncausal'}": nonpaged_fwd_tile(d, c, gpu)
                for d in (128, 256)
                for c in (False, True)
            }
            for key, gpu in GPUS.items()
        },
        "shapes": rows,
    }


if __name__ == "__main__":
    print(json.dumps(table(), indent=1))
