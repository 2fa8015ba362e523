"""mm-prefix-fa on the wheel's real FlashAttention kernels: exactness against a dense masked reference, and cost.

Runs on a CUDA machine where the OVERLAID vLLM 0.21.0 wheel is importable (e.g. PYTHONPATH=<--target dir>):

    python mm_prefix_kernel.py --json OUT.json [--fa-version 3|2] [--seed 0] [--iters 20] [--warmup 5]

Every case is a batch of several requests over a paged KV cache in vLLM's layout (block size 16, bf16, GQA 8 q
heads / 2 kv heads, head sizes 128 and 256): chunked prefills whose earlier chunks are already in the cache,
multimodal (mm) ranges starting before a chunk's first query, ending after its last one or lying exactly on its
edges, ranges longer and shorter than a sliding window, text-only requests and decode rows mixed in.

The code under test is vLLM's own: FlashAttentionImpl.forward of the installed (patched) vllm, with metadata from
the real FlashAttentionMetadataBuilder.build (FA3's AOT scheduler metadata included) and the per-request mm
ranges set on it afterwards exactly as gpu_model_runner._set_mm_prefix_range_for_metadata does (a dict over every
request index, empty lists for text-only requests). The chunk's own K/V goes into the cache through
FlashAttentionImpl.do_kv_cache_update (reshape_and_cache_flash); the earlier chunks' K/V is placed directly. The
attention kernel is vLLM's flash_attn_varlen_func (vllm.vllm_flash_attn, FA3 `_vllm_fa3_C` by default on sm_90;
`--fa-version 2` selects `_vllm_fa2_C`, whose first calls JIT-compile from PTX on sm_90 for minutes).
`--entry run_mm_prefix_calls` instead drives the series' module directly (one causal flash_attn_varlen_func call,
then mm_prefix_fa.mm_prefix_spans / cached_mm_prefix_calls / run_mm_prefix_calls), for diagnosis only.

Each output is compared with a dense float32 reference on the same device: key j is visible to the query at
position i when ``j <= i and i - j < W`` (W = sliding window, as vLLM hands FlashAttention ``(W - 1, 0)``) or when
i and j lie in the same mm range ``[s, e]`` (inclusive; ``s >= e`` ignored; keys only up to the chunk's last
computed position) -- the mask of tests/integration/series_a/attention_reference.py. A case passes when
max_abs_error <= --atol (2e-2, bf16), when the plain causal call (same batch, no ranges: the unpatched path) FAILS
that comparison wherever the mask differs from causal (so the check can fail), and, for the text-only control,
when the patched output is bit-identical to the causal one. Timing: CUDA events, warm-up then median of N, of the
patched forward (calls cache warm, as for every layer after the first; and cold, as for the first) against the
plain causal forward of the same batch.

``--cpu-selfcheck`` is a SELF-CHECK OF THIS HARNESS ONLY (batch building, metadata plumbing, reference): it swaps
the compiled kernels for the CPU tests' torch stand-in (attention_reference.varlen_attention) and a torch
reshape_and_cache_flash, runs on CPU with the vLLM source tree on PYTHONPATH, and records entry='cpu-selfcheck'.
Its numbers say nothing about the kernels and must never be recorded as results.

Exit status: 0 all cases pass, 1 a case fails or errors, 2 setup failed (JSON is written in every case).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from jsonio import write  # beside this script: python puts the script's folder on sys.path

NUM_HEADS = 8
NUM_KV_HEADS = 2
BLOCK_SIZE = 16
HEAD_SIZES = (128, 256)
DEFAULT_ATOL = 2e-2
SELFCHECK_ATOL = 1e-4
SELFCHECK_ENTRY = "cpu-selfcheck"
HERE = Path(__file__).resolve().parent
CPU_REFERENCE = HERE.parents[1] / "integration" / "series_a" / "attention_reference.py"


# --------------------------------------------------------------------------------------------------------------
# Cases (head-size independent; torch-free)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Req:
    """One request of a batch: `context` tokens already in the KV cache (earlier chunks), `query` scheduled now,
    mm ranges as absolute inclusive prompt positions (what PlaceholderRange.extract_embeds_range gives)."""

    context: int
    query: int
    ranges: tuple[tuple[int, int], ...] = ()

    @property
    def seq_len(self) -> int:
        return self.context + self.query


@dataclass(frozen=True)
class Case:
    name: str
    reqs: tuple[Req, ...]
    sliding_window: int | None = None
    text_only: bool = False
    note: str = ""


def case_specs() -> list[Case]:
    return [
        Case(
            "chunk_edges",
            (
                Req(0, 1, ((10, 200),)),  # decode-like row: a 1-token chunk far past its range
                Req(0, 300, ((20, 83), (100, 100), (150, 229))),  # whole prompt; (100, 100) is degenerate
                Req(128, 96, ((40, 90), (100, 160), (200, 260))),  # range before / starting before / ending after
                Req(64, 64, ((0, 63), (64, 127), (128, 150))),  # ranges exactly on the chunk's edges
                Req(40, 1, ((30, 50),)),  # a 1-token chunk inside a range: later keys are not computed yet
                Req(0, 77),  # text-only request in an mm batch
                Req(512, 1, ((10, 200),)),  # decode
            ),
            note="ranges cut by chunk edges, chunked prefill, text-only request, decode rows",
        ),
        Case(
            "sliding_window",
            (
                Req(0, 1),  # decode
                Req(0, 260, ((10, 49), (100, 219))),  # ranges shorter / longer than W
                Req(200, 80, ((180, 230), (250, 400))),  # chunked: range starts before, range ends after
                Req(30, 50),  # text-only
                Req(399, 1, ((300, 350),)),  # decode, window past the range
                Req(96, 32, ((40, 127),)),  # range longer than W, its end exactly at the chunk's last query
            ),
            sliding_window=64,
            note="W=64: rows deeper than s+W see exactly [s, e]; the causal part stays windowed",
        ),
        Case(
            "decode_heavy",
            (
                *(Req(100 + 37 * i, 1, ((5, 60),)) for i in range(8)),
                Req(256, 128, ((200, 300), (330, 383))),
                Req(0, 16, ((3, 12),)),
            ),
            note="8 decode rows past their images beside two chunks with images",
        ),
        Case(
            "long_prefill",
            (
                Req(0, 2048, tuple((8 + 300 * k, 8 + 300 * k + 279) for k in range(6))),
                Req(2048, 1024, ((1900, 2179), (2900, 3179))),
                Req(1500, 1),
            ),
            note="six 280-token images in a 2048-token prompt; a 1024-token chunk with images across both edges",
        ),
        Case(
            "long_prefill_window",
            (
                Req(0, 2048, tuple((8 + 300 * k, 8 + 300 * k + 279) for k in range(6))),
                Req(2048, 1024, ((1900, 2179), (2900, 3179))),
            ),
            sliding_window=512,
            note="the same with a 512-token sliding window (images shorter than W)",
        ),
        Case(
            "text_only_control",
            (Req(0, 200), Req(128, 64), Req(700, 1), Req(33, 1)),
            text_only=True,
            note="no ranges: the runner still hands {idx: []}; output must equal the causal call bit for bit",
        ),
    ]


def mm_prefix_range_of(case: Case) -> dict[int, list[tuple[int, int]]]:
    """What gpu_model_runner hands every metadata object: every request index, [] for text-only requests."""
    return {i: [tuple(r) for r in req.ranges] for i, req in enumerate(case.reqs)}  # type: ignore[misc]


# --------------------------------------------------------------------------------------------------------------
# Batch building and the dense reference (torch only)
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Batch:
    case: Case
    head_size: int
    query: Any  # (num_tokens, H, D)
    key: Any  # (num_tokens, KVH, D): this chunk's keys, packed like the query
    value: Any
    kv_cache: Any  # (2, num_blocks, block_size, KVH, D) view in the backend's stride order
    block_table: Any  # (num_reqs, max_blocks) int32, device
    slot_mapping: Any  # (num_tokens,) int64, device
    query_start_loc_cpu: Any  # (num_reqs + 1,) int32
    seq_lens_cpu: Any  # (num_reqs,) int32
    keys: list[Any]  # per request, all seq_len keys (context + chunk), for the reference
    values: list[Any]

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc_cpu[-1])


def kv_cache_stride_order() -> tuple[int, ...]:
    try:
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

        return tuple(FlashAttentionBackend.get_kv_cache_stride_order())
    except Exception:  # no vLLM (harness tests) or no layout known: vLLM's default NHD
        return (0, 1, 2, 3, 4)


def build_batch(
    case: Case,
    head_size: int,
    *,
    seed: int,
    device: Any,
    dtype: Any,
    num_heads: int = NUM_HEADS,
    num_kv_heads: int = NUM_KV_HEADS,
    block_size: int = BLOCK_SIZE,
    stride_order: Sequence[int] = (0, 1, 2, 3, 4),
    write_chunk: bool = True,
) -> Batch:
    """Random q/k/v (drawn on CPU in float32, so any device sees the same numbers), a paged KV cache whose unused
    slots hold other random values, blocks scattered at random (block 0 is the null block, as in vLLM). The earlier
    chunks' keys are placed in the cache; the chunk's own keys are placed too when `write_chunk` (otherwise the
    caller writes them with vLLM's do_kv_cache_update through `slot_mapping`)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    reqs = case.reqs
    blocks_per = [(r.seq_len + block_size - 1) // block_size for r in reqs]
    num_blocks = 1 + sum(blocks_per) + 5
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    block_table = torch.zeros(len(reqs), max(blocks_per), dtype=torch.int32)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)

    shape = (2, num_blocks, block_size, num_kv_heads, head_size)
    physical = randn(*(shape[i] for i in stride_order))
    inverse = [list(stride_order).index(i) for i in range(len(shape))]
    kv_cache_cpu = physical.permute(*inverse)
    assert tuple(kv_cache_cpu.shape) == shape

    keys, values, q_parts, k_parts, v_parts, slots = [], [], [], [], [], []
    starts = [0]
    for r, (req, count) in enumerate(zip(reqs, blocks_per, strict=True)):
        mine, free = free[:count], free[count:]
        block_table[r, :count] = torch.tensor(mine, dtype=torch.int32)
        k_all, v_all = randn(req.seq_len, num_kv_heads, head_size), randn(req.seq_len, num_kv_heads, head_size)
        keys.append(k_all)
        values.append(v_all)
        pos = torch.arange(req.seq_len)
        blk = block_table[r, pos // block_size].long()
        off = pos % block_size
        upto = req.seq_len if write_chunk else req.context
        kv_cache_cpu[0, blk[:upto], off[:upto]] = k_all[:upto]
        kv_cache_cpu[1, blk[:upto], off[:upto]] = v_all[:upto]
        q_parts.append(randn(req.query, num_heads, head_size))
        k_parts.append(k_all[req.context :])
        v_parts.append(v_all[req.context :])
        slots.append(blk[req.context :] * block_size + off[req.context :])
        starts.append(starts[-1] + req.query)

    kv_cache = physical.to(device).permute(*inverse)
    return Batch(
        case=case,
        head_size=head_size,
        query=torch.cat(q_parts).to(device),
        key=torch.cat(k_parts).to(device),
        value=torch.cat(v_parts).to(device),
        kv_cache=kv_cache,
        block_table=block_table.to(device),
        slot_mapping=torch.cat(slots).to(device),
        query_start_loc_cpu=torch.tensor(starts, dtype=torch.int32),
        seq_lens_cpu=torch.tensor([r.seq_len for r in reqs], dtype=torch.int32),
        keys=[k.to(device) for k in keys],
        values=[v.to(device) for v in values],
    )


def dense_mask(req: Req, window: int | None, device: Any = "cpu", *, with_ranges: bool = True) -> Any:
    """(query, seq_len) bool: ``(causal AND window) OR (query and key in the same mm range)``."""
    import torch

    pos = torch.arange(req.context, req.seq_len, device=device)[:, None]
    j = torch.arange(req.seq_len, device=device)[None, :]
    mask = j <= pos
    if window is not None:
        mask &= (pos - j) < window
    if with_ranges:
        for start, end in req.ranges:
            if start >= end:
                continue
            mask |= (pos >= start) & (pos <= end) & (j >= start) & (j <= end)
    return mask


def dense_reference(batch: Batch, scale: float, *, with_ranges: bool = True) -> Any:
    """float32 (num_tokens, H, D) from the bf16 inputs, one dense masked softmax per request."""
    import torch

    window = batch.case.sliding_window
    outs = []
    starts = batch.query_start_loc_cpu.tolist()
    for r, req in enumerate(batch.case.reqs):
        q = batch.query[starts[r] : starts[r + 1]].float()
        group = q.shape[1] // batch.keys[r].shape[1]
        k = batch.keys[r].float().repeat_interleave(group, dim=1)
        v = batch.values[r].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        mask = dense_mask(req, window, q.device, with_ranges=with_ranges)
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(outs)


def bidirectional_rows(case: Case) -> int:
    """Query rows whose mask differs from the plain causal (windowed) one: where a causal call must be wrong."""
    total = 0
    for req in case.reqs:
        full = dense_mask(req, case.sliding_window)
        causal = dense_mask(req, case.sliding_window, with_ranges=False)
        total += int((full != causal).any(dim=1).sum())
    return total


# --------------------------------------------------------------------------------------------------------------
# CPU self-check stand-ins (harness validation only)
# --------------------------------------------------------------------------------------------------------------


def load_cpu_reference() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("series_a_attention_reference", CPU_REFERENCE)
    assert spec is not None and spec.loader is not None, CPU_REFERENCE
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def torch_reshape_and_cache_flash(
    key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, *_: Any, **__: Any
) -> None:
    """reshape_and_cache_flash for the self-check (the custom op is not built on CPU)."""
    n = slot_mapping.shape[0]
    block_size = key_cache.shape[1]
    slots = slot_mapping.long()
    key_cache[slots // block_size, slots % block_size] = key[:n]
    value_cache[slots // block_size, slots % block_size] = value[:n]


# --------------------------------------------------------------------------------------------------------------
# vLLM side
# --------------------------------------------------------------------------------------------------------------


class CountingKernel:
    """Passes every call through to the kernel and counts them (installed for the correctness runs only)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(
            {
                "causal": kwargs.get("causal"),
                "window_size": list(kwargs["window_size"]) if kwargs.get("window_size") is not None else None,
                "num_seqs": int(kwargs["cu_seqlens_q"].shape[0]) - 1 if "cu_seqlens_q" in kwargs else None,
                "q_rows": int(kwargs["q"].shape[0]) if "q" in kwargs else None,
                "scheduler_metadata": kwargs.get("scheduler_metadata") is not None,
            }
        )
        return self.fn(*args, **kwargs)


@contextlib.contextmanager
def kernel_swapped(module: Any, fn: Callable[..., Any]) -> Iterator[None]:
    old = module.flash_attn_varlen_func
    module.flash_attn_varlen_func = fn
    try:
        yield
    finally:
        module.flash_attn_varlen_func = old


class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args = args
        self.selfcheck = bool(args.cpu_selfcheck)
        if not self.selfcheck and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device (--cpu-selfcheck tests the harness only)")
        self.device = torch.device("cpu" if self.selfcheck else "cuda")
        # The self-check runs in float32: the torch stand-in then matches the reference to ~1e-6, so any harness
        # slip (slots, block table, ranges, metadata) shows; bf16 is what the GPU run uses.
        self.dtype = torch.float32 if self.selfcheck else torch.bfloat16
        self.fa_version = int(args.fa_version)
        self.setup_notes: dict[str, Any] = {}
        self._configs: dict[int, Any] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="mm_prefix_kernel_")

        import vllm
        from vllm.v1.attention.backends import flash_attn, mm_prefix_fa

        self.vllm = vllm
        self.fa = flash_attn
        self.mm = mm_prefix_fa
        missing = [
            name for name in ("_forward_mm_prefix_rows",) if not hasattr(flash_attn.FlashAttentionImpl, name)
        ] + [
            name
            for name in ("mm_prefix_range", "query_start_loc_cpu", "seq_lens_cpu")
            if name not in flash_attn.FlashAttentionMetadata.__dataclass_fields__
        ]
        self.setup_notes["vllm_version"] = getattr(vllm, "__version__", None)
        self.setup_notes["vllm_file"] = str(Path(vllm.__file__).parent)
        self.setup_notes["patched"] = not missing
        if missing:
            raise RuntimeError(f"the installed vLLM is not overlaid with mm-prefix-fa (missing: {missing})")

        if self.selfcheck:
            ref = load_cpu_reference()
            self.kernel = ref.varlen_attention
            flash_attn.flash_attn_varlen_func = self.kernel
            flash_attn.reshape_and_cache_flash = torch_reshape_and_cache_flash
            self.setup_notes["kernel"] = f"{CPU_REFERENCE.name}:varlen_attention (torch stand-in, SELF-CHECK)"
        else:
            kernel = getattr(flash_attn, "flash_attn_varlen_func", None)
            if kernel is None:
                raise RuntimeError(
                    "vllm.v1.attention.backends.flash_attn has no flash_attn_varlen_func "
                    "(is_flash_attn_varlen_func_available() is False)"
                )
            self.kernel = kernel
            self.setup_notes["kernel"] = f"{kernel.__module__}.{kernel.__qualname__}"
            from vllm.vllm_flash_attn import flash_attn_interface as fai

            supported: dict[str, Any] = {}
            for v in (2, 3, 4):
                try:
                    supported[str(v)] = [fai.is_fa_version_supported(v), fai.fa_version_unsupported_reason(v)]
                except Exception as exc:
                    supported[str(v)] = [False, f"{type(exc).__name__}: {exc}"]
            self.setup_notes["fa_versions_supported"] = supported
            if not fai.is_fa_version_supported(self.fa_version):
                raise RuntimeError(
                    f"FA{self.fa_version} unsupported here: {fai.fa_version_unsupported_reason(self.fa_version)}"
                )
            from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

            self.setup_notes["vllm_default_fa_version"] = get_flash_attn_version()
        self.stride_order = kv_cache_stride_order()
        self.setup_notes["kv_cache_stride_order"] = list(self.stride_order)

    # ---- config / builder ------------------------------------------------------------------------------------

    def vllm_config(self, head_size: int) -> Any:
        """A VllmConfig for an mm-prefix model with this case's geometry (config.json only, no weights)."""
        if head_size in self._configs:
            return self._configs[head_size]
        from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig

        model_dir = Path(self._tmp.name) / f"model_d{head_size}"
        model_dir.mkdir(exist_ok=True)
        (model_dir / "config.json").write_text(
            json.dumps(
                {
                    "architectures": ["Qwen3ForCausalLM"],
                    "model_type": "qwen3",
                    "hidden_size": NUM_HEADS * head_size,
                    "intermediate_size": 1024,
                    "num_hidden_layers": 1,
                    "num_attention_heads": NUM_HEADS,
                    "num_key_value_heads": NUM_KV_HEADS,
                    "head_dim": head_size,
                    "vocab_size": 1024,
                    "max_position_embeddings": 8192,
                    "is_mm_prefix_lm": True,
                    "torch_dtype": "bfloat16",
                }
            )
        )
        model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=8192, dtype="bfloat16")
        config = VllmConfig(
            model_config=model,
            cache_config=CacheConfig(block_size=BLOCK_SIZE),
            device_config=DeviceConfig(device=self.device.type),
        )
        if not self.selfcheck and hasattr(config.attention_config, "flash_attn_version"):
            config.attention_config.flash_attn_version = self.fa_version
        self._configs[head_size] = config
        return config

    def config_context(self, config: Any) -> Any:
        try:
            from vllm.config import set_current_vllm_config
        except ImportError:
            return contextlib.nullcontext()
        return set_current_vllm_config(config)

    def make_impl(self, head_size: int, window: int | None, config: Any | None) -> Any:
        ctx = self.config_context(config) if config is not None else contextlib.nullcontext()
        with ctx:
            impl = self.fa.FlashAttentionImpl(
                num_heads=NUM_HEADS,
                head_size=head_size,
                scale=head_size**-0.5,
                num_kv_heads=NUM_KV_HEADS,
                alibi_slopes=None,
                sliding_window=window,
                kv_cache_dtype="auto",
            )
        picked = impl.vllm_flash_attn_version
        impl.vllm_flash_attn_version = self.fa_version
        return impl, picked

    def common_metadata(self, batch: Batch) -> Any:
        import torch
        from vllm.v1.attention.backend import CommonAttentionMetadata

        qsl_cpu, seq_cpu = batch.query_start_loc_cpu, batch.seq_lens_cpu
        fields = {
            "query_start_loc": qsl_cpu.to(self.device),
            "query_start_loc_cpu": qsl_cpu,
            "seq_lens": seq_cpu.to(self.device),
            "num_reqs": len(batch.case.reqs),
            "num_actual_tokens": batch.num_tokens,
            "max_query_len": max(r.query for r in batch.case.reqs),
            "max_seq_len": max(r.seq_len for r in batch.case.reqs),
            "block_table_tensor": batch.block_table,
            "slot_mapping": batch.slot_mapping,
            "causal": True,
            "seq_lens_cpu_upper_bound": seq_cpu,  # what gpu_model_runner passes (exact outside async spec decode)
            "_seq_lens_cpu": seq_cpu,
            "_num_computed_tokens_cpu": torch.tensor([r.context for r in batch.case.reqs], dtype=torch.int32),
            "is_prefilling": torch.tensor([r.query > 1 for r in batch.case.reqs], device=self.device),
        }
        known = CommonAttentionMetadata.__dataclass_fields__
        return CommonAttentionMetadata(**{k: v for k, v in fields.items() if k in known})

    def build_metadata(self, batch: Batch, impl: Any, config: Any) -> tuple[Any, dict[str, Any]]:
        """FlashAttentionMetadataBuilder.build, as the model runner calls it (common_prefix_len 0: cascade
        attention is off for mm-prefix models). Falls back to the same fields set by hand if the builder cannot
        be made here; the source is recorded."""
        info: dict[str, Any] = {}
        cm = self.common_metadata(batch)
        try:
            if config is None:
                raise RuntimeError("no VllmConfig (see config_error)")
            from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

            window = batch.case.sliding_window
            if window is None:
                spec = FullAttentionSpec(
                    block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS, head_size=batch.head_size, dtype=self.dtype
                )
            else:
                spec = SlidingWindowSpec(
                    block_size=BLOCK_SIZE,
                    num_kv_heads=NUM_KV_HEADS,
                    head_size=batch.head_size,
                    dtype=self.dtype,
                    sliding_window=window,
                )
            with self.config_context(config):
                builder = self.fa.FlashAttentionMetadataBuilder(spec, ["layers.0.self_attn.attn"], config, self.device)
                # What build() derives from the registered layers (none are registered here): FA3's AOT scheduler
                # is for FA3 only, and it is told the layers' window.
                builder.aot_schedule = bool(builder.aot_schedule) and self.fa_version == 3
                builder.aot_sliding_window = tuple(impl.sliding_window)
                if self.fa_version != 3:  # FA2 takes no split count (what __init__ gives when it sees FA2)
                    builder.max_num_splits = 0
                md = builder.build(common_prefix_len=0, common_attn_metadata=cm)
            info["metadata"] = "FlashAttentionMetadataBuilder.build"
            info["builder"] = {
                "aot_schedule": bool(builder.aot_schedule),
                "aot_sliding_window": list(builder.aot_sliding_window or ()),
                "use_full_cuda_graph": bool(getattr(builder, "use_full_cuda_graph", False)),
                "max_num_splits": int(md.max_num_splits),
                "scheduler_metadata": md.scheduler_metadata is not None,
            }
            try:
                support = self.fa.FlashAttentionMetadataBuilder.get_cudagraph_support(config, spec)
                info["builder"]["cudagraph_support"] = support.name
            except Exception as exc:  # informative only
                info["builder"]["cudagraph_support"] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            if self.args.require_builder:
                raise
            info["metadata"] = "hand-built FlashAttentionMetadata (builder failed)"
            info["builder_error"] = f"{type(exc).__name__}: {exc}"[-2000:]
            md = self.fa.FlashAttentionMetadata(
                num_actual_tokens=cm.num_actual_tokens,
                max_query_len=cm.max_query_len,
                query_start_loc=cm.query_start_loc,
                max_seq_len=cm.max_seq_len,
                seq_lens=cm.seq_lens,
                block_table=cm.block_table_tensor,
                slot_mapping=cm.slot_mapping,
                use_cascade=False,
                common_prefix_len=0,
                cu_prefix_query_lens=None,
                prefix_kv_lens=None,
                suffix_kv_lens=None,
                causal=True,
                query_start_loc_cpu=cm.query_start_loc_cpu,
                seq_lens_cpu=batch.seq_lens_cpu,
            )
        return md, info

    # ---- one case ----------------------------------------------------------------------------------------------

    def run_case(self, case: Case, head_size: int, seed: int) -> dict[str, Any]:
        import torch

        window = case.sliding_window
        scale = head_size**-0.5
        ranges = mm_prefix_range_of(case)
        result: dict[str, Any] = {
            "name": f"{case.name}/d{head_size}",
            "head_size": head_size,
            "num_requests": len(case.reqs),
            "query_lens": [r.query for r in case.reqs],
            "seq_lens": [r.seq_len for r in case.reqs],
            "mm_ranges": {str(k): [list(r) for r in v] for k, v in ranges.items()},
            "sliding_window": window,
            "note": case.note,
        }
        entry = self.args.entry
        config = None
        if entry == "forward":
            try:
                config = self.vllm_config(head_size)
            except Exception as exc:
                if self.args.require_builder:
                    raise
                result["config_error"] = f"{type(exc).__name__}: {exc}"[-2000:]
        impl, picked = self.make_impl(head_size, window, config)
        result["impl_fa_version_vllm_picked"] = picked
        result["fa_version"] = impl.vllm_flash_attn_version
        batch = build_batch(
            case,
            head_size,
            seed=seed,
            device=self.device,
            dtype=self.dtype,
            stride_order=self.stride_order,
            write_chunk=entry != "forward",
        )
        layer = torch.nn.Module()
        for name in ("_q_scale", "_k_scale", "_v_scale"):  # what Attention registers (0-dim float32, 1.0)
            layer.register_buffer(name, torch.tensor(1.0, dtype=torch.float32, device=self.device))

        if entry == "forward":
            md, info = self.build_metadata(batch, impl, config)
            result.update(info)
            # The chunk's K/V through vLLM's cache write, as the layer does before forward.
            impl.do_kv_cache_update(layer, batch.key, batch.value, batch.kv_cache, batch.slot_mapping)
            result["kv_write"] = "FlashAttentionImpl.do_kv_cache_update"
            md_causal = dataclasses.replace(md, mm_prefix_range=None, mm_prefix_calls_cache=None)
            md_mm = dataclasses.replace(md, mm_prefix_range=ranges, mm_prefix_calls_cache=None)

            def run(metadata: Any, out: Any) -> Any:
                return impl.forward(layer, batch.query, batch.key, batch.value, batch.kv_cache, metadata, out)

            def patched(out: Any, cold: bool = False) -> Any:
                if cold:
                    md_mm.mm_prefix_calls_cache = None
                    if hasattr(self.mm, "_STEP"):  # mm-prefix-fa v10 keeps the step's rows and calls too
                        self.mm._STEP = None
                return run(md_mm, out)

            def causal(out: Any) -> Any:
                return run(md_causal, out)
        else:
            result["metadata"] = "none (direct calls)"
            result["kv_write"] = "direct"
            patched, causal = self.direct_calls(batch, impl, ranges, scale)

        expected = dense_reference(batch, scale)
        if self.selfcheck:
            # This reference against the CPU tests' own (attention_reference.dense_mm_prefix, no clamp).
            cpu_ref = load_cpu_reference()
            view = SimpleNamespace(
                seq_lens=[r.seq_len for r in case.reqs],
                query_lens=[r.query for r in case.reqs],
                ranges=ranges,
                query=batch.query,
                query_starts=batch.query_start_loc_cpu.tolist(),
                keys=batch.keys,
                values=batch.values,
            )
            theirs = cpu_ref.dense_mm_prefix(view, window, False, scale)
            result["selfcheck_reference_vs_cpu_tests"] = float((theirs.float() - expected).abs().max())
        bidi = bidirectional_rows(case)
        result["bidirectional_rows"] = bidi

        out_c = torch.zeros_like(batch.query)
        out_p = torch.zeros_like(batch.query)
        counter = CountingKernel(self.kernel)
        with kernel_swapped(self.fa, counter):
            causal(out_c)
            result["kernel_calls_causal"] = counter.calls
            counter.calls = []
            patched(out_p, True)
            result["kernel_calls_patched"] = counter.calls
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        spans = self.mm.mm_prefix_spans(ranges, batch.query_start_loc_cpu, batch.seq_lens_cpu)
        result["mm_rows"] = sum(sp.num_rows for sp in spans)

        err = (out_p.float() - expected).abs()
        err_c = (out_c.float() - expected).abs()
        in_mm = torch.zeros(batch.num_tokens, dtype=torch.bool, device=self.device)
        for sp in spans:
            in_mm[sp.first_row : sp.first_row + sp.num_rows] = True
        result["max_abs_error"] = float(err.max())
        result["max_abs_error_mm_rows"] = float(err[in_mm].max()) if bool(in_mm.any()) else None
        result["max_abs_error_other_rows"] = float(err[~in_mm].max()) if bool((~in_mm).any()) else None
        result["causal_only_max_abs_error"] = float(err_c.max())
        result["max_abs_reference"] = float(expected.abs().max())
        result["nonfinite"] = int((~torch.isfinite(out_p)).sum())
        atol = self.args.atol
        checks = {
            "exact": result["max_abs_error"] <= atol and result["nonfinite"] == 0,
            # the comparison can fail: the unpatched (causal) output must fail it wherever the mask differs
            "causal_only_fails": (result["causal_only_max_abs_error"] > atol) if bidi else None,
            # the recompute ran: one causal call, then extra non-causal calls iff rows lie in ranges
            "extra_calls": (len(result["kernel_calls_patched"]) > 1) == bool(spans)
            and len(result["kernel_calls_causal"]) == 1,
        }
        if case.text_only:
            checks["identical_to_causal"] = bool(torch.equal(out_p, out_c))
        result["checks"] = checks
        result["pass"] = all(v is not False for v in checks.values())

        # ---- timing (a failure here keeps the correctness result) ----
        for key in ("t_patched_ms", "t_patched_cold_ms", "t_causal_ms", "ratio", "ratio_cold"):
            result[key] = None
        try:
            t_p = self.time_ms(lambda: patched(out_p))
            t_cold = self.time_ms(lambda: patched(out_p, True))
            t_c = self.time_ms(lambda: causal(out_c))
            result["t_patched_ms"] = t_p
            result["t_patched_cold_ms"] = t_cold
            result["t_causal_ms"] = t_c
            result["ratio"] = t_p / t_c if t_c > 0 else None
            result["ratio_cold"] = t_cold / t_c if t_c > 0 else None
        except Exception as exc:
            result["timing_error"] = f"{type(exc).__name__}: {exc}"[-2000:]
        return result

    def direct_calls(self, batch: Batch, impl: Any, ranges: Any, scale: float) -> tuple[Any, Any]:
        """--entry run_mm_prefix_calls: the causal call and the series' module, without forward."""
        import torch

        starts = batch.query_start_loc_cpu.to(self.device)
        seq_lens = batch.seq_lens_cpu.to(self.device)
        key_cache, value_cache = batch.kv_cache.unbind(0)
        reqs = batch.case.reqs
        ones = torch.ones(1, dtype=torch.float32, device=self.device).expand(len(reqs), NUM_KV_HEADS)
        kw = {
            "softmax_scale": scale,
            "alibi_slopes": None,
            "softcap": 0,
            "fa_version": self.fa_version,
            "q_descale": ones,
            "k_descale": ones,
            "v_descale": ones,
        }
        window = batch.case.sliding_window
        spans = self.mm.mm_prefix_spans(ranges, batch.query_start_loc_cpu, batch.seq_lens_cpu)
        cache: dict[Any, Any] = {}

        def causal(out: Any) -> None:
            self.fa.flash_attn_varlen_func(
                q=batch.query,
                k=key_cache,
                v=value_cache,
                out=out,
                cu_seqlens_q=starts,
                max_seqlen_q=max(r.query for r in reqs),
                seqused_k=seq_lens,
                max_seqlen_k=max(r.seq_len for r in reqs),
                causal=True,
                window_size=list(impl.sliding_window),
                block_table=batch.block_table,
                **kw,
            )

        def patched(out: Any, cold: bool = False) -> None:
            causal(out)
            if cold:
                cache.clear()
            calls = self.mm.cached_mm_prefix_calls(cache, spans, window, False, self.device)
            self.mm.run_mm_prefix_calls(
                self.fa.flash_attn_varlen_func,
                calls,
                query=batch.query,
                key_cache=key_cache,
                value_cache=value_cache,
                output=out,
                block_table=batch.block_table,
                **kw,
            )

        return patched, causal

    def time_ms(self, fn: Callable[[], Any]) -> float:
        import torch

        warmup, iters = self.args.warmup, self.args.iters
        if self.device.type != "cuda":  # self-check: wall time, a couple of runs (numbers mean nothing)
            times = []
            for _ in range(min(iters, 2)):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(times)
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)


# --------------------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------------------


def device_block(selfcheck: bool) -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        if not selfcheck and torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["name"] = props.name
            info["capability"] = "{}.{}".format(*torch.cuda.get_device_capability(0))
            info["memory_gib"] = round(props.total_memory / 2**30, 1)
        elif selfcheck:
            info["name"] = "cpu (harness self-check)"
            info["capability"] = None
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    info["driver"] = None
    try:
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode == 0 and out.stdout.strip():
            info["driver"] = out.stdout.strip().splitlines()[0].strip()
    except (OSError, ValueError):
        pass
    return info


def summarize(doc: dict[str, Any]) -> None:
    cases = doc["cases"]
    errors = [c["max_abs_error"] for c in cases if isinstance(c.get("max_abs_error"), float)]
    ratios = [c["ratio"] for c in cases if isinstance(c.get("ratio"), float)]
    mm_ratios = [c["ratio"] for c in cases if isinstance(c.get("ratio"), float) and c.get("mm_rows")]
    cold = [c["ratio_cold"] for c in cases if isinstance(c.get("ratio_cold"), float) and c.get("mm_rows")]
    doc["max_abs_error"] = max(errors) if errors else None
    doc["ratio_median"] = statistics.median(ratios) if ratios else None
    doc["ratio_median_mm_cases"] = statistics.median(mm_ratios) if mm_ratios else None
    doc["ratio_cold_median_mm_cases"] = statistics.median(cold) if cold else None
    doc["metadata_sources"] = sorted({str(c["metadata"]) for c in cases if c.get("metadata")})
    doc["num_cases"] = len(cases)
    doc["num_failed"] = sum(1 for c in cases if not c.get("pass"))
    doc["num_errors"] = sum(1 for c in cases if c.get("error"))
    doc["ok"] = bool(cases) and doc["num_failed"] == 0 and not doc.get("setup_error")


def print_table(doc: dict[str, Any]) -> None:
    if doc["entry"] == SELFCHECK_ENTRY:
        print("*** CPU SELF-CHECK OF THE HARNESS: torch stand-in kernel, not a result ***")
    head = f"{'case':32} {'err':>9} {'causal_err':>10} {'mm_rows':>7} {'t_mm ms':>9} {'t_caus ms':>9} {'ratio':>6} pass"
    print(head)
    print("-" * len(head))

    def fmt(x: Any, spec: str) -> str:
        return format(x, spec) if isinstance(x, (int, float)) else "-"

    for c in doc["cases"]:
        print(
            f"{c['name']:32} {fmt(c.get('max_abs_error'), '9.2e')} {fmt(c.get('causal_only_max_abs_error'), '10.2e')} "
            f"{fmt(c.get('mm_rows'), '7d')} {fmt(c.get('t_patched_ms'), '9.3f')} {fmt(c.get('t_causal_ms'), '9.3f')} "
            f"{fmt(c.get('ratio'), '6.2f')}  {'ok' if c.get('pass') else 'FAIL'}"
            + (f"  [{c['error'].splitlines()[0][:80]}]" if c.get("error") else "")
        )
    print(
        f"entry={doc['entry']} fa_version={doc['fa_version']} device={doc['device'].get('name')} "
        f"max_abs_error={fmt(doc.get('max_abs_error'), '.3e')} (atol {doc['atol']}) "
        f"ratio_median={fmt(doc.get('ratio_median'), '.3f')} ok={doc['ok']}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True, help="where to write the result")
    ap.add_argument(
        "--fa-version",
        type=int,
        choices=(2, 3),
        default=3,
        help="FlashAttention version for every call (default 3; FA2 JIT-compiles on sm_90 first)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument(
        "--atol",
        type=float,
        default=None,
        help=f"pass threshold on max_abs_error (default {DEFAULT_ATOL} for bf16; {SELFCHECK_ATOL} in the "
        "float32 self-check)",
    )
    ap.add_argument("--head-sizes", type=int, nargs="+", default=list(HEAD_SIZES))
    ap.add_argument("--cases", nargs="*", default=None, help="case names to run (default: all)")
    ap.add_argument(
        "--entry",
        choices=("forward", "run_mm_prefix_calls"),
        default="forward",
        help="forward: FlashAttentionImpl.forward with builder metadata (default); run_mm_prefix_calls: "
        "the series' module driven directly (diagnosis)",
    )
    ap.add_argument(
        "--require-builder",
        action="store_true",
        help="fail a case instead of hand-building its metadata when the builder cannot be made",
    )
    ap.add_argument(
        "--cpu-selfcheck",
        action="store_true",
        help="SELF-CHECK OF THIS HARNESS ONLY: CPU, torch stand-in kernel; never a recorded result",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.atol is None:
        args.atol = SELFCHECK_ATOL if args.cpu_selfcheck else DEFAULT_ATOL
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    entry = "FlashAttentionImpl.forward" if args.entry == "forward" else "mm_prefix_fa.run_mm_prefix_calls"
    doc: dict[str, Any] = {
        "script": "tests/gpu/e2e/mm_prefix_kernel.py",
        "device": device_block(args.cpu_selfcheck),
        "fa_version": args.fa_version,
        "entry": SELFCHECK_ENTRY if args.cpu_selfcheck else entry,
        "entry_detail": entry + (" with the torch stand-in kernel (harness self-check)" if args.cpu_selfcheck else ""),
        "harness_selfcheck": bool(args.cpu_selfcheck),
        "atol": args.atol,
        "seed": args.seed,
        "warmup": args.warmup,
        "iters": args.iters,
        "geometry": {
            "num_heads": NUM_HEADS,
            "num_kv_heads": NUM_KV_HEADS,
            "block_size": BLOCK_SIZE,
            "dtype": "float32 (self-check)" if args.cpu_selfcheck else "bfloat16",
            "reference": "dense float32 on the same device",
        },
        "cases": [],
    }
    status = 0
    try:
        t_setup = time.perf_counter()
        harness = Harness(args)
        doc["setup"] = harness.setup_notes
        doc["setup"]["setup_s"] = round(time.perf_counter() - t_setup, 2)
        if args.fa_version == 2 and not args.cpu_selfcheck:
            print("note: FA2 on sm_90 JIT-compiles its kernels from PTX on first use (minutes)", flush=True)
        specs = [c for c in case_specs() if args.cases is None or c.name in args.cases]
        index = 0
        for case in specs:
            for head_size in args.head_sizes:
                index += 1
                name = f"{case.name}/d{head_size}"
                print(f"[{index}] {name} ...", flush=True)
                t0 = time.perf_counter()
                try:
                    res = harness.run_case(case, head_size, args.seed * 1000 + index)
                except Exception as exc:
                    res = {
                        "name": name,
                        "head_size": head_size,
                        "num_requests": len(case.reqs),
                        "mm_ranges": {str(k): [list(r) for r in v] for k, v in mm_prefix_range_of(case).items()},
                        "sliding_window": case.sliding_window,
                        "max_abs_error": None,
                        "causal_only_max_abs_error": None,
                        "t_patched_ms": None,
                        "t_causal_ms": None,
                        "ratio": None,
                        "pass": False,
                        "error": f"{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc()[-6000:],
                    }
                    try:
                        import torch

                        if torch.cuda.is_available() and not args.cpu_selfcheck:
                            torch.cuda.synchronize()
                    except Exception as sync_exc:  # a sticky CUDA error: later cases will report it too
                        res["sync_error"] = f"{type(sync_exc).__name__}: {sync_exc}"
                res["wall_s"] = round(time.perf_counter() - t0, 2)
                doc["cases"].append(res)
                print(
                    f"    {'ok' if res.get('pass') else 'FAIL'} err={res.get('max_abs_error')} "
                    f"causal_err={res.get('causal_only_max_abs_error')} ratio={res.get('ratio')} "
                    f"{res.get('error', '')}",
                    flush=True,
                )
                summarize(doc)
                write(args.json, doc)  # keep what ran even if a later case kills the process
    except Exception as exc:
        doc["setup_error"] = f"{type(exc).__name__}: {exc}"
        doc["setup_traceback"] = traceback.format_exc()[-6000:]
        print(doc["setup_traceback"], file=sys.stderr)
        status = 2
    summarize(doc)
    write(args.json, doc)
    print_table(doc)
    if status == 0 and not doc["ok"]:
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
