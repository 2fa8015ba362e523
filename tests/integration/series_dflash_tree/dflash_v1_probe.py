"""Runs inside a vLLM 0.21.0 source tree (PYTHONPATH=<tree>) and prints one JSON line of facts about its V1 DFlash
drafting path with a drafter shaped like Gemma 4's (four sliding layers, one full layer): the KV cache spec of each
draft layer and the window its attention applies, the KV cache groups the tree's own grouping makes of a Gemma 4
target's layers plus the drafter's, the proposer's own check of those groups, the metadata builders it creates for
the draft layers, and the query buffers it reads at CUDA-graph padded sizes.

Usage: python dflash_v1_probe.py WORKDIR [all|padding] (model configs are written in WORKDIR; padding: only the
proposer's query buffers, for trees whose V1 drafter refuses mixed layers). Runs on the patched tree and on older
variants of it (a section the tree cannot produce reports its error instead of failing the run).
Real: the draft model and its Attention layers, KVCacheSpec classes, get_kv_cache_groups and
get_kv_cache_config_from_groups, DFlashProposer (its __init__, validate_same_kv_cache_group,
initialize_attn_backend, cudagraph dispatch), AttentionGroup and the backends' metadata builders, one-process gloo
"distributed" state. Stood in: the platform's resolution of a selected backend to its class (the CUDA platform
needs a GPU; the enum's own class is used), its answers on pinned memory (none) and on the hybrid KV cache
manager (supported, as on CUDA), and the target model (its layers' KV cache specs are written out with
Gemma 4 26B-A4B's shape: 25 sliding layers of head_dim 256, 5 full layers of head_dim 512; no weights exist)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import vllm.utils.torch_utils as torch_utils  # before any module binds its PIN_MEMORY

if hasattr(torch_utils, "PIN_MEMORY"):  # newer trees: pinned host memory decided once, at import
    torch_utils.PIN_MEMORY = False  # pinned host memory needs an accelerator

WORK = Path(sys.argv[1])
# "all", or "padding" (only the proposer's query buffers: trees whose V1 drafter takes no mixed layers)
MODE = sys.argv[2] if len(sys.argv) > 2 else "all"
os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)

TARGET_HEADS = 2  # the target's query heads: a builder that falls back to the model config gets these
DRAFT_HEADS, DRAFT_KV_HEADS, DRAFT_HEAD_DIM = 4, 2, 128
WINDOW = 64
DRAFT_LAYER_TYPES = ["sliding_attention"] * 4 + ["full_attention"]
NUM_SPEC, MAX_SEQS = 6, 6  # 6 requests x (1 + 6) = 42 queries; CUDA-graph sizes pad 42 to 48
CAPTURE_SIZES = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]

TARGET = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": TARGET_HEADS,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
}
DRAFT = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": len(DRAFT_LAYER_TYPES),
    "layer_types": DRAFT_LAYER_TYPES,
    "use_sliding_window": True,
    "sliding_window": WINDOW,
    "num_attention_heads": DRAFT_HEADS,
    "num_key_value_heads": DRAFT_KV_HEADS,
    "head_dim": DRAFT_HEAD_DIM,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "block_size": 16,
    "torch_dtype": "bfloat16",
    "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 3]},
}

facts: dict[str, Any] = {}


def section(name: str, fn: Callable[[], Any]) -> None:
    try:
        facts[name] = fn()
    except Exception as exc:  # reported, not fatal: older trees lack parts of this
        facts[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}


# MiMo-style: every layer sliding through dflash_config.use_swa, none named, so every layer stays non-causal.
SWA_DRAFT = {
    **{k: v for k, v in DRAFT.items() if k != "layer_types"},
    "num_hidden_layers": 2,
    "dflash_config": {**DRAFT["dflash_config"], "use_swa": True, "swa_window_size": WINDOW},
}


def write_configs(draft: dict[str, Any]) -> tuple[Path, Path]:
    draft_name = "draft" if draft is DRAFT else "draft_swa"
    for name, config in (("target", TARGET), (draft_name, draft)):
        (WORK / name).mkdir(parents=True, exist_ok=True)
        (WORK / name / "config.json").write_text(json.dumps(config))
    return WORK / "target", WORK / draft_name


def vllm_config(backend: str, draft: dict[str, Any] = DRAFT) -> Any:
    import vllm.config.vllm as vllm_module
    from vllm.config import DeviceConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode

    # The runner choice of a GPU machine, where Triton is installed: without it 0.26.0-0.29.0 take the V1 runner,
    # which refuses this mixed drafter when the config is made (0.33.0 makes that exception on real platforms only).
    if getattr(vllm_module, "HAS_TRITON", True) is False:
        vllm_module.HAS_TRITON = True
    target_dir, draft_dir = write_configs(draft)
    target = ModelConfig(model=str(target_dir), skip_tokenizer_init=True, max_model_len=1024)
    spec = SpeculativeConfig(
        method="dflash",
        model=str(draft_dir),
        num_speculative_tokens=NUM_SPEC,
        target_model_config=target,
        target_parallel_config=ParallelConfig(),
        attention_backend=backend,
    )
    config = VllmConfig(model_config=target, speculative_config=spec, device_config=DeviceConfig(device="cpu"))
    # What a CUDA platform leaves after its own config checks: piecewise CUDA graphs at these sizes.
    config.scheduler_config.max_num_seqs = MAX_SEQS
    config.compilation_config.cudagraph_mode = CUDAGraphMode.PIECEWISE
    config.compilation_config.cudagraph_capture_sizes = list(CAPTURE_SIZES)
    config.compilation_config.max_cudagraph_capture_size = CAPTURE_SIZES[-1]
    return config


def init_distributed(config: Any) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{tempfile.mktemp(dir=WORK)}",
            backend="gloo",
        )
        initialize_model_parallel(1, 1)


def stand_in_platform() -> None:
    import vllm.v1.spec_decode.llm_base_proposer as base
    from vllm.platforms import current_platform
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    base.is_pin_memory_available = lambda: False  # pinned host memory needs an accelerator
    # The CUDA platform runs the hybrid KV cache manager (sliding and full layers in their own groups).
    type(current_platform).support_hybrid_kv_cache = classmethod(lambda cls: True)

    def resolve(backend: Any, attn_selector_config: Any = None, num_heads: int | None = None) -> Any:
        return (backend or AttentionBackendEnum.FLASH_ATTN).get_class()

    selector._cached_get_attn_backend = resolve


def build_proposer(config: Any) -> Any:
    """The real proposer, its __init__ run on CPU."""
    from vllm.v1.spec_decode.dflash import DFlashProposer

    return DFlashProposer(config, torch.device("cpu"))


def build_drafter(config: Any, proposer: Any) -> Any:
    """The real draft model, built as load_model builds it, handed to the proposer."""
    from vllm.config import get_layers_from_vllm_config, set_current_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

    draft_config = proposer._create_draft_vllm_config()
    with set_current_vllm_config(draft_config):
        model = DFlashQwen3ForCausalLM(vllm_config=draft_config, prefix="")
    proposer.model = model
    layers = get_layers_from_vllm_config(config, AttentionLayerBase)  # type: ignore[type-abstract]
    proposer._draft_attn_layer_names = set(layers)  # the target's layers are not built here
    return model


def draft_layers(model: Any, config: Any) -> list[dict[str, Any]]:
    out = []
    for layer in model.model.layers:
        attn = layer.self_attn.attn
        spec = attn.get_kv_cache_spec(config)
        out.append(
            {
                "name": attn.layer_name,
                "window": attn.sliding_window,
                "kernel_window": list(attn.impl.sliding_window),
                "spec": type(spec).__name__,
                "spec_window": getattr(spec, "sliding_window", None),
                "causal": getattr(layer.self_attn, "causal", None),
            }
        )
    return out


def target_specs() -> dict[str, Any]:
    """Gemma 4 26B-A4B's attention layers as KV cache specs (5:1 sliding:full)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    specs: dict[str, Any] = {}
    for i in range(30):
        name = f"language_model.model.layers.{i}.self_attn.attn"
        if i % 6 == 5:
            specs[name] = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=512, dtype=torch.bfloat16)
        else:
            specs[name] = SlidingWindowSpec(
                block_size=16, num_kv_heads=8, head_size=256, dtype=torch.bfloat16, sliding_window=1024
            )
    return specs


def kv_cache_config(config: Any, model: Any) -> tuple[Any, dict[str, Any]]:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups

    specs = target_specs()
    attns = [layer.self_attn.attn for layer in model.model.layers]
    draft = {attn.layer_name: attn.get_kv_cache_spec(config) for attn in attns}
    specs.update(draft)
    groups = get_kv_cache_groups(config, specs)
    page = max(g.kv_cache_spec.page_size_bytes for g in groups)
    kv_config = get_kv_cache_config_from_groups(config, groups, page * 64 * max(len(g.layer_names) for g in groups))
    summary = [
        {
            "spec": type(g.kv_cache_spec).__name__,
            "draft_layers": sorted(n for n in g.layer_names if n in draft),
            "target_layers": len([n for n in g.layer_names if n not in draft]),
        }
        for g in groups
    ]
    return kv_config, {"groups": summary, "num_groups": len(groups)}


def split_draft_layout(kv_config: Any, model: Any) -> Any:
    """The same KV cache config with the draft's sliding and full layers in two groups (what sliding-window
    specs for the sliding layers give)."""
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    names = [layer.self_attn.attn.layer_name for layer in model.model.layers]
    sliding, full = names[:-1], names[-1:]
    groups = [
        KVCacheGroupSpec([n for n in g.layer_names if n not in names], g.kv_cache_spec)
        for g in kv_config.kv_cache_groups
    ]
    spec = next(g.kv_cache_spec for g in kv_config.kv_cache_groups if set(names) & set(g.layer_names))
    groups = [g for g in groups if g.layer_names]
    groups += [KVCacheGroupSpec(sliding, spec), KVCacheGroupSpec(full, spec)]
    return KVCacheConfig(num_blocks=kv_config.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def check(fn: Callable[[], Any]) -> str:
    try:
        fn()
        return "ok"
    except AssertionError as exc:
        return f"AssertionError: {exc}"


def builders(proposer: Any, model: Any) -> list[dict[str, Any]]:
    windows = {layer.self_attn.attn.layer_name: layer.self_attn.attn.sliding_window for layer in model.model.layers}
    out = []
    causal = getattr(proposer, "_draft_group_causal", None) or [None] * len(proposer.draft_attn_groups)
    for group, is_causal in zip(proposer.draft_attn_groups, causal, strict=True):
        builder = group.get_metadata_builder()
        out.append(
            {
                "backend": group.backend.get_name(),
                "kv_cache_group": group.kv_cache_group_id,
                "layers": list(group.layer_names),
                "windows": sorted({str(windows[n]) for n in group.layer_names}),
                "causal": is_causal,
                "num_heads_q": getattr(builder, "num_heads_q", None),
            }
        )
    return out


def padding(proposer: Any) -> list[dict[str, int]]:
    """Every query count a drafting step can have, the size the drafter's dispatcher runs it at, and what the
    query buffers hold at that size."""
    from vllm.config.compilation import CUDAGraphMode

    proposer.initialize_cudagraph_keys(CUDAGraphMode.PIECEWISE)
    name = "model.layers.4.self_attn.attn"
    proposer._draft_attn_layer_names = {name}  # the slot mapping is one view for every draft layer
    out = []
    for reqs in range(1, MAX_SEQS + 1):
        queries = reqs * (1 + NUM_SPEC)
        _, padded, _ = proposer._determine_batch_execution_and_padding(queries)
        out.append(
            {
                "queries": queries,
                "padded": padded,
                "positions": proposer._get_positions(padded).shape[0],
                "slot_mapping": proposer._get_slot_mapping(padded)[name].shape[0],
            }
        )
    return out


def noncausal_sliding() -> dict[str, Any]:
    """A drafter whose every layer is sliding and non-causal (use_swa), on FlashAttention: each layer's own
    FlashAttentionImpl.forward on one drafting step (the 1 + k block rows at the end of a context longer than the
    window), with the reference kernel standing in for the compiled one, against a dense mask: a non-causal
    sliding row at position i sees the keys j with |i - j| < W, later block tokens included."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "series_a"))
    import attention_reference as ref
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends import flash_attn

    config = vllm_config("flash_attn", SWA_DRAFT)
    recorder = ref.Recorder()
    flash_attn.flash_attn_varlen_func = recorder
    out: dict[str, Any] = {"layers": []}
    with set_current_vllm_config(config):
        proposer = build_proposer(config)
        model = build_drafter(config, proposer)
        gen = torch.Generator().manual_seed(3)
        seq_len, q_len, block = WINDOW + 90, 1 + NUM_SPEC, 16
        num_blocks = (seq_len + block - 1) // block
        keys = torch.randn(num_blocks * block, DRAFT_KV_HEADS, DRAFT_HEAD_DIM, generator=gen)
        values = torch.randn(num_blocks * block, DRAFT_KV_HEADS, DRAFT_HEAD_DIM, generator=gen)
        query = torch.randn(q_len, DRAFT_HEADS, DRAFT_HEAD_DIM, generator=gen)
        kv_cache = torch.stack([keys.view(num_blocks, block, DRAFT_KV_HEADS, DRAFT_HEAD_DIM),
                                values.view(num_blocks, block, DRAFT_KV_HEADS, DRAFT_HEAD_DIM)])
        for layer in model.model.layers:
            attn = layer.self_attn.attn
            impl = attn.impl
            impl.vllm_flash_attn_version = 2
            fields: dict[str, Any] = {
                "num_actual_tokens": q_len, "max_query_len": q_len,
                "query_start_loc": torch.tensor([0, q_len], dtype=torch.int32),
                "max_seq_len": seq_len, "seq_lens": torch.tensor([seq_len], dtype=torch.int32),
                "block_table": torch.arange(num_blocks, dtype=torch.int32)[None],
                "slot_mapping": torch.zeros(q_len, dtype=torch.long),
                "use_cascade": False, "common_prefix_len": 0, "cu_prefix_query_lens": None,
                "prefix_kv_lens": None, "suffix_kv_lens": None,
                "causal": layer.self_attn.causal,
            }
            metadata = flash_attn.FlashAttentionMetadata(**fields)
            scales = {name: torch.ones(1) for name in ("_q_scale", "_k_scale", "_v_scale")}
            shim = type("Layer", (), scales)()
            output = torch.zeros_like(query)
            recorder.calls.clear()
            impl.forward(shim, query, query, query, kv_cache, metadata, output)
            pos = torch.arange(seq_len - q_len, seq_len)[:, None]
            j = torch.arange(seq_len)[None, :]
            mask = (pos - j).abs() < WINDOW
            reps = DRAFT_HEADS // DRAFT_KV_HEADS
            k_all = keys[:seq_len].repeat_interleave(reps, dim=1)
            v_all = values[:seq_len].repeat_interleave(reps, dim=1)
            scores = torch.einsum("qhd,khd->hqk", query, k_all) * impl.scale
            probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            expected = torch.einsum("hqk,khd->qhd", probs, v_all)
            out["layers"].append({
                "causal": layer.self_attn.causal,
                "window": attn.sliding_window,
                "call_windows": [list(c["window_size"]) for c in recorder.calls],
                "max_err": (output - expected).abs().max().item(),
            })
    return out


def skip_sliding_quantization() -> dict[str, Any]:
    """An fp8 KV cache with --kv-cache-dtype-skip-layers sliding_window (the target's sliding layers keep bf16):
    the KV cache dtype and spec of every draft layer as the tree's own layers make them, the groups the tree's
    grouping makes of them beside the Gemma 4 target, and the proposer's one-group check."""
    from vllm.config import set_current_vllm_config

    config = vllm_config("triton_attn")
    config.cache_config.cache_dtype = "fp8"
    config.cache_config.kv_cache_dtype_skip_layers = ["sliding_window"]
    with set_current_vllm_config(config):
        proposer = build_proposer(config)
        model = build_drafter(config, proposer)
        attns = [layer.self_attn.attn for layer in model.model.layers]
        kv_config, grouping = kv_cache_config(config, model)
        return {
            "dtypes": [attn.kv_cache_dtype for attn in attns],
            "spec_dtypes": [str(attn.get_kv_cache_spec(config).dtype) for attn in attns],
            "groups_with_draft": len([g for g in grouping["groups"] if g["draft_layers"]]),
            "validate": check(lambda: proposer.validate_same_kv_cache_group(kv_config)),
        }


def run(backend: str) -> dict[str, Any]:
    from vllm.config import set_current_vllm_config

    if "distributed" not in facts:
        stand_in_platform()
    config = vllm_config(backend)
    if "distributed" not in facts:
        init_distributed(config)
        facts["distributed"] = True
    result: dict[str, Any] = {}
    with set_current_vllm_config(config):
        proposer = build_proposer(config)
        result["padding"] = padding(proposer)
        if MODE == "padding":
            return result
        model = build_drafter(config, proposer)
        result["layers"] = draft_layers(model, config)
        kv_config, result["grouping"] = kv_cache_config(config, model)
        result["validate"] = check(lambda: proposer.validate_same_kv_cache_group(kv_config))
        result["validate_split"] = check(
            lambda: proposer.validate_same_kv_cache_group(split_draft_layout(kv_config, model))
        )
        proposer.initialize_attn_backend(kv_config)
        result["builders"] = builders(proposer, model)
    return result


section("triton", lambda: run("triton_attn"))
if MODE == "all":
    section("flash_attn", lambda: run("flash_attn"))
    section("noncausal_sliding", noncausal_sliding)
    section("skip_sliding", skip_sliding_quantization)
print("DFLASH_V1_FACTS " + json.dumps(facts))
