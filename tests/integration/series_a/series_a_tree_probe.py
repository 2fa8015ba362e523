"""Runs inside a vLLM source tree (PYTHONPATH=<tree>) and prints one JSON object of facts for the series_a
tests: what the tree's own code does with a DFlash / MTP drafter on a multimodal-prefix target, what its
FlashAttention backend says about mm-prefix support, and what its FlashAttentionImpl.forward computes.

Usage: python series_a_tree_probe.py TARGET_DIR DRAFT_DIR MIXED_DRAFT_DIR (MIXED_DRAFT_DIR: a DFlash drafter with
sliding and full layers). Works on pristine and patched trees (facts a tree cannot produce are reported as null).
Only what cannot exist on a CPU machine is replaced: the compiled flash_attn_varlen_func (by the reference in
attention_reference.py, recording its calls), the FA2 kernel's presence, model weights (get_model), and the
platform's resolution of a selected backend to its class."""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
from types import SimpleNamespace
from typing import Any

import attention_reference as ref
import torch

TARGET_DIR, DRAFT_DIR, MIXED_DRAFT_DIR = sys.argv[1], sys.argv[2], sys.argv[3]
# The runner a user gets by default is measured, not one forced from the environment.
os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
facts: dict[str, Any] = {}


def backend_name(attention_config: Any) -> str | None:
    backend = attention_config.backend
    return None if backend is None else backend.name


def gpu_runner_choice() -> None:
    """The runner choice of a GPU machine: there Triton is installed, here it is not, and 0.26.0-0.29.0 then take
    the V1 runner for everything (0.33.0 makes that exception only on real platforms)."""
    import vllm.config.vllm as vllm_module

    if getattr(vllm_module, "HAS_TRITON", True) is False:
        vllm_module.HAS_TRITON = True


def configs(attention_backend: str | None, draft_dir: str = DRAFT_DIR) -> Any:
    from vllm.config import DeviceConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

    gpu_runner_choice()
    from vllm.model_executor.models.config import Gemma4Config

    target = ModelConfig(model=TARGET_DIR, skip_tokenizer_init=True, max_model_len=1024)
    extra = {} if attention_backend is None else {"attention_backend": attention_backend}
    spec = SpeculativeConfig(
        method="dflash",
        model=draft_dir,
        num_speculative_tokens=4,
        target_model_config=target,
        target_parallel_config=ParallelConfig(),
        **extra,
    )
    config = VllmConfig(model_config=target, speculative_config=spec, device_config=DeviceConfig(device="cpu"))
    # Gemma4's own hook: heterogeneous head dims (256 / 512) force TRITON_ATTN on the target.
    Gemma4Config.verify_and_update_config(config)
    facts["target_backend_by_hook"] = backend_name(config.attention_config)
    if config.attention_config.backend is None:
        # Newer trees read per-layer head sizes from a real Gemma4 checkpoint config; without FA4 they
        # land on the same choice: force TRITON_ATTN on the target.
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        config.attention_config.backend = AttentionBackendEnum.TRITON_ATTN
    # The model runner reads the flag long before a drafter is built (a cached property on newer trees).
    assert config.model_config.is_mm_prefix_lm
    return config


def proposer(cls: type, config: Any) -> Any:
    """A proposer carrying only the state _create_draft_vllm_config reads (its __init__ allocates device
    buffers and needs a model runner)."""
    obj = cls.__new__(cls)
    obj.vllm_config = config
    obj.speculative_config = config.speculative_config
    obj.dflash_causal = False
    return obj


def mm_reason(config: Any, head_size: int) -> bool:
    """Whether FlashAttention refuses layers of this head size for the config's mm-prefix flag."""
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    reasons = FlashAttentionBackend.validate_configuration(
        head_size=head_size,
        dtype=torch.bfloat16,
        kv_cache_dtype="auto",
        block_size=None,
        use_mla=False,
        has_sink=False,
        use_sparse=False,
        use_mm_prefix=config.model_config.is_mm_prefix_lm,
        use_per_head_quant_scales=False,
        device_capability=DeviceCapability(12, 0),
        attn_type="decoder",
    )
    # "partial multimodal token full attention not supported", or a combination reason naming mm_prefix.
    return any("multimodal" in reason or "mm_prefix" in reason for reason in reasons)


def drafter_facts(config: Any) -> dict[str, Any]:
    return {
        "mm_prefix": config.model_config.is_mm_prefix_lm,
        "backend": backend_name(config.attention_config),
        "flash_attn_refuses": mm_reason(config, 128),
    }


def decoupling() -> None:
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.spec_decode.gemma4 import Gemma4Proposer

    config = configs(None)
    target_arch_before = config.model_config.model_arch_config.is_mm_prefix_lm
    facts["target_backend"] = backend_name(config.attention_config)
    facts["v1_dflash"] = drafter_facts(proposer(DFlashProposer, config)._create_draft_vllm_config())
    facts["target_after"] = {
        "mm_prefix": config.model_config.is_mm_prefix_lm,
        "arch_mm_prefix": config.model_config.model_arch_config.is_mm_prefix_lm,
        "arch_before": target_arch_before,
        "backend": backend_name(config.attention_config),
    }
    mtp = proposer(Gemma4Proposer, config)._create_draft_vllm_config()
    facts["v1_mtp"] = {
        "mm_prefix": mtp.model_config.is_mm_prefix_lm,
        "backend": backend_name(mtp.attention_config),
        "same_model_config": mtp.model_config is config.model_config,
    }
    explicit = configs("flash_attn")
    facts["v1_dflash_explicit"] = drafter_facts(proposer(DFlashProposer, explicit)._create_draft_vllm_config())
    facts["v2"] = v2_facts(config) if v2_present() else None
    facts["v2_explicit"] = v2_facts(explicit) if v2_present() else None


def v2_present() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm.v1.worker.gpu.spec_decode.dflash") is not None


def v2_facts(config: Any) -> dict[str, Any]:
    layers, builders = v2_configs(config)
    return {
        "layers": drafter_facts(layers),
        "builders": drafter_facts(builders),
        "builders_non_causal": builders.attention_config.use_non_causal,
        "target_mm_prefix_after": config.model_config.is_mm_prefix_lm,
    }


def v2_configs(config: Any) -> tuple[Any, Any]:
    """The V2 runner's DFlash path: the config its draft layers are built from (load_dflash_model, with
    get_model recording instead of loading weights) and the config its metadata builders get."""
    import torch.nn as nn
    from vllm.v1.worker.gpu.spec_decode.dflash import utils as dflash_utils
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator

    seen: list[Any] = []

    class Recorded(Exception):
        pass

    def get_model(*, vllm_config: Any, model_config: Any, **_: Any) -> nn.Module:
        # What the draft layers would be built from; the weights cannot be loaded here.
        seen.append(vllm_config)
        raise Recorded

    dflash_utils.get_model = get_model
    # One process, no pipeline parallelism: the load config passes through unchanged.
    dflash_utils.get_pp_safe_draft_load_config = lambda load_config: load_config
    with contextlib.suppress(Recorded):
        dflash_utils.load_dflash_model(nn.Module(), config)
    speculator = DFlashSpeculator.__new__(DFlashSpeculator)
    speculator.vllm_config = config
    speculator.requires_non_causal = True
    return seen[0], speculator.attn_vllm_config


PER_KIND = "FLEX_ATTENTION"  # a backend neither the target's forced one nor the speculative one


def per_kind() -> None:
    """A Gemma 4 target that also names a backend per KV-cache kind (AttentionConfig.backend_per_kind), for
    both kinds a DFlash drafter's layers can have, with a drafter mixing sliding and full layers (the shape of
    Gemma 4 DFlash drafters). Per path: the backend the tree's own selector picks for each drafter layer kind
    (only the platform's resolution of that choice to a class is stood in for: it needs a GPU). Also which
    model runner the tree picks for that user, and why the other one is out."""
    from vllm.config import AttentionConfig, set_current_vllm_config
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.spec_decode.gemma4 import Gemma4Proposer

    facts["runner"] = None
    if "backend_per_kind" not in AttentionConfig.__dataclass_fields__:  # 0.21.0 as released: no per-kind overrides
        facts["per_kind"] = None
        return
    from vllm.model_executor.models import qwen3_dflash
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    # A draft layer's sliding window: 0.33.0's own helper, or the one 0.21.0's series adds.
    layer_window = getattr(qwen3_dflash, "_resolve_layer_attention", None) or qwen3_dflash.dflash_layer_attention

    def kind_name(is_sliding: bool) -> str:
        if hasattr(selector, "get_attn_spec_kind"):  # 0.33.0: a KVCacheSpecKind
            kind = selector.get_attn_spec_kind(use_mla=False, has_sliding_window=is_sliding, attn_type="decoder")
            return str(kind.value)
        return str(selector.attention_layer_kind(False, is_sliding, "decoder"))  # 0.21.0 with the series

    def with_per_kind(attention_backend: str | None) -> Any:
        config = configs(attention_backend, MIXED_DRAFT_DIR)
        config.attention_config.backend_per_kind = {
            "full_attention": AttentionBackendEnum[PER_KIND],
            "sliding_window": AttentionBackendEnum[PER_KIND],
        }
        return config

    auto, explicit = with_per_kind(None), with_per_kind("flash_attn")
    hf_config = explicit.speculative_config.draft_model_config.hf_config
    with set_current_vllm_config(explicit):
        sliding = [layer_window(hf_config, i)[0] is not None for i in range(hf_config.num_hidden_layers)]

    chosen: list[Any] = []
    resolve = selector._cached_get_attn_backend
    selector._cached_get_attn_backend = lambda backend, **_: chosen.append(backend)

    def selected(config: Any) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        with set_current_vllm_config(config):
            for is_sliding in sliding:
                selector.get_attn_backend(
                    head_size=128,
                    dtype=torch.bfloat16,
                    kv_cache_dtype="auto",
                    use_mm_prefix=config.model_config.is_mm_prefix_lm,
                    has_sliding_window=is_sliding,
                )
                out[kind_name(is_sliding)] = None if chosen[-1] is None else chosen[-1].name
        return out

    result: dict[str, Any] = {"target": selected(explicit)}
    for name, config in (("auto", auto), ("explicit", explicit)):
        result[f"v1_dflash_{name}"] = selected(proposer(DFlashProposer, config)._create_draft_vllm_config())
        if v2_present():  # 0.21.0 has no V2 DFlash path
            layers, builders = v2_configs(config)
            result[f"v2_layers_{name}"] = selected(layers)
            result[f"v2_builders_{name}"] = selected(builders)
    result["v1_mtp"] = selected(proposer(Gemma4Proposer, explicit)._create_draft_vllm_config())
    selector._cached_get_attn_backend = resolve
    facts["per_kind"] = result
    if not hasattr(explicit, "_get_v2_model_runner_unsupported_features"):
        return  # 0.21.0: DFlash drafts on V1 only
    # A CUDA machine has Triton with an active driver; this one may not (the runner choice reads it).
    import vllm.config.vllm as vllm_config_module

    vllm_config_module.HAS_TRITON = True
    v1_unsupported = getattr(explicit, "_get_v1_model_runner_unsupported_features", None)
    facts["runner"] = {
        "draft_layers_sliding": sliding,
        "use_v2_model_runner": explicit.use_v2_model_runner,
        "use_v2_model_runner_full_only_draft": configs("flash_attn").use_v2_model_runner,
        "v2_unsupported": explicit._get_v2_model_runner_unsupported_features(),
        # 0.29.0 and newer refuse mixed drafters on V1 in the config; 0.26.0 when the draft layers are built
        "v1_unsupported": None if v1_unsupported is None else v1_unsupported(),
        "v1_layer_refusal": v1_layer_refusal(explicit, layer_window, hf_config),
    }


def v1_layer_refusal(config: Any, layer_window: Any, hf_config: Any) -> str | None:
    """What the tree's own draft-layer code says about this drafter when the V1 runner is asked for."""
    from vllm.config import set_current_vllm_config

    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    try:
        with set_current_vllm_config(config):
            for i in range(hf_config.num_hidden_layers):
                layer_window(hf_config, i)
    except NotImplementedError as exc:
        return str(exc)
    finally:
        os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    return None


def flash_attention() -> None:
    from vllm.v1.attention.backends import flash_attn

    # The installed FlashAttention is FA2 (SM120): the varlen kernel is there, FA4 is not.
    flash_attn.is_flash_attn_varlen_func_available = lambda: True
    flash_attn.is_fa_version_supported = lambda version: version != 4
    backend = flash_attn.FlashAttentionBackend
    facts["fa_supports_mm_prefix"] = backend.supports_mm_prefix()
    per_head = getattr(backend, "supports_mm_prefix_for_head_size", None)
    facts["fa_mm_prefix_for_head"] = None if per_head is None else {str(h): per_head(h) for h in (64, 128, 256, 512)}
    cfg = SimpleNamespace(model_config=SimpleNamespace(is_mm_prefix_lm=True))
    facts["fa_refuses_mm_256"] = mm_reason(cfg, 256)
    facts["fa_refuses_mm_512"] = mm_reason(cfg, 512)
    # Full CUDA graphs (FA3 reports ALWAYS): an mm-prefix model keeps mixed batches out of them.
    from vllm.v1.attention.backend import AttentionCGSupport

    builder = flash_attn.FlashAttentionMetadataBuilder
    builder._cudagraph_support = AttentionCGSupport.ALWAYS
    facts["fa_cudagraph"] = {
        str(flag): builder.get_cudagraph_support(
            SimpleNamespace(model_config=SimpleNamespace(is_mm_prefix_lm=flag)), None
        ).name
        for flag in (True, False)
    }
    facts["forward"] = forward_facts(flash_attn)
    facts["fa_subclasses"] = subclass_facts(flash_attn)
    facts["xpu"] = xpu_facts(flash_attn)


# Modules of the trees that subclass FlashAttentionBackend (some only in newer trees; a module that cannot be
# imported on a CPU machine is reported as such).
FA_SUBCLASS_MODULES = (
    "vllm.v1.attention.backends.flash_attn_diffkv",
    "vllm.v1.attention.backends.triton_flash_attn",
    "vllm.models.qwen4_exp.nvidia.qsa",
    "vllm.models.step5.nvidia.sparse_attention",
)


def subclass_facts(flash_attn: Any) -> dict[str, Any]:
    """Every FlashAttentionBackend subclass of the tree: whether its layers run a forward of their own (not
    FlashAttentionImpl.forward, which is where mm rows are recomputed), and what it says about mm-prefix."""
    import importlib
    import importlib.util

    imported: dict[str, str | None] = {}
    for name in FA_SUBCLASS_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                continue
            importlib.import_module(name)
            imported[name] = None
        except Exception as exc:  # kernels a CPU machine lacks
            imported[name] = f"{type(exc).__name__}: {exc}"[:200]
    out: dict[str, Any] = {"imported": imported, "classes": {}}
    pending = list(flash_attn.FlashAttentionBackend.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        impl = cls.get_impl_cls()
        per_head = getattr(cls, "supports_mm_prefix_for_head_size", None)
        out["classes"][f"{cls.__module__}.{cls.__qualname__}"] = {
            "own_forward": impl.forward is not flash_attn.FlashAttentionImpl.forward,
            "supports_mm_prefix": cls.supports_mm_prefix(),
            "for_head_128": None if per_head is None else per_head(128),
        }
    return out


def forward_facts(flash_attn: Any) -> dict[str, Any]:
    """FlashAttentionImpl.forward itself, with the reference kernel recording its calls."""
    rng = random.Random(7)
    result: dict[str, Any] = {"text_only": [], "mm_max_err": None, "mm_extra_calls": None}
    has_spans = "mm_prefix_spans" in flash_attn.FlashAttentionMetadata.__dataclass_fields__
    has_ranges = "mm_prefix_range" in flash_attn.FlashAttentionMetadata.__dataclass_fields__
    worst, extra = 0.0, 0
    for trial in range(24):
        window = [None, 5, 12][trial % 3]
        with_ranges = trial >= 6
        batch = ref.random_batch(rng, with_ranges=with_ranges, head_size=32, block_size=16)
        recorder = ref.Recorder()
        flash_attn.flash_attn_varlen_func = recorder
        if hasattr(flash_attn, "_FA4_DENSE_ATTENTION_KERNEL"):
            flash_attn._FA4_DENSE_ATTENTION_KERNEL = recorder
        impl = make_impl(flash_attn, window)
        metadata = make_metadata(flash_attn, batch)
        if with_ranges:
            set_ranges(flash_attn, metadata, batch)
        kv_cache = kv_cache_for(flash_attn, batch)
        layer = SimpleNamespace(_q_scale=torch.ones(1), _k_scale=torch.ones(1), _v_scale=torch.ones(1))
        # Gemma4's opt-in clamp of the bidirectional block to the window (read on trees that know it).
        clamp = has_spans and window is not None and trial % 2 == 1
        layer.mm_prefix_clamp_sliding_window = clamp
        output = torch.zeros_like(batch.query)
        impl.forward(layer, batch.query, batch.query, batch.query, kv_cache, metadata, output)
        if with_ranges and (has_spans or has_ranges) and "refusals" not in result:
            result["refusals"] = refusals(impl, layer, batch.query, kv_cache, metadata)
        if not with_ranges:
            result["text_only"].append(recorder.summary())
        elif has_spans or has_ranges:
            expected = ref.dense_mm_prefix(batch, window, clamp, 32**-0.5)
            worst = max(worst, (output - expected).abs().max().item())
            extra += len(recorder.calls) - 1
    if has_spans or has_ranges:
        result["mm_max_err"] = worst
        result["mm_extra_calls"] = extra
    result["runner_ranges"] = runner_ranges_facts(flash_attn)
    return result


def make_impl(flash_attn: Any, window: int | None) -> Any:
    impl = flash_attn.FlashAttentionImpl(
        num_heads=4,
        head_size=32,
        scale=32**-0.5,
        num_kv_heads=2,
        alibi_slopes=None,
        sliding_window=window,
        kv_cache_dtype="auto",
    )
    impl.vllm_flash_attn_version = 2
    return impl


def make_metadata(flash_attn: Any, batch: ref.MMBatch) -> Any:
    """The tree's own FlashAttentionMetadata for a batch, with no mm ranges set."""
    starts = torch.tensor(batch.query_starts, dtype=torch.int32)
    fields: dict[str, Any] = {
        "num_actual_tokens": int(starts[-1]),
        "max_query_len": max(batch.query_lens),
        "query_start_loc": starts,
        "max_seq_len": max(batch.seq_lens),
        "seq_lens": torch.tensor(batch.seq_lens, dtype=torch.int32),
        "block_table": batch.block_table,
        "slot_mapping": torch.zeros(int(starts[-1]), dtype=torch.long),
    }
    if "use_cascade" in flash_attn.FlashAttentionMetadata.__dataclass_fields__:
        fields.update(
            use_cascade=False,
            common_prefix_len=0,
            cu_prefix_query_lens=None,
            prefix_kv_lens=None,
            suffix_kv_lens=None,
        )
    return flash_attn.FlashAttentionMetadata(**fields)


def set_ranges(flash_attn: Any, metadata: Any, batch: ref.MMBatch) -> None:
    """The batch's mm ranges on the metadata, where the tree's own code puts them."""
    fields_now = flash_attn.FlashAttentionMetadata.__dataclass_fields__
    starts = torch.tensor(batch.query_starts, dtype=torch.int32)
    seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int32)
    if "mm_prefix_range" in fields_now:  # 0.21.0: the model runner sets the ranges after build
        metadata.mm_prefix_range = batch.ranges
        metadata.query_start_loc_cpu = starts
        metadata.seq_lens_cpu = seq_lens
    if "mm_prefix_spans" in fields_now:  # 0.26.0 on: the builder records the rows
        from vllm.v1.attention.backends.mm_prefix_fa import mm_prefix_spans

        metadata.mm_prefix_spans = mm_prefix_spans(batch.ranges, starts, seq_lens)
        # the builder's FA4 range tensor, which the forward reads as "this batch has ranges"
        # (0.29.0 on: per query token; 0.26.0: per request)
        marker = "mm_prefix_query_range_tensor" if "mm_prefix_query_range_tensor" in fields_now else (
            "mm_prefix_range_tensor")
        setattr(metadata, marker, torch.zeros(1, 2, dtype=torch.int32))


def as_cuda_machine() -> None:
    """FlashAttention's platform answers as on a CUDA machine, where the series' mm-prefix recompute is meant to
    run (is_cuda); everything else is still asked of this machine's own platform."""
    from vllm.v1.attention.backends import flash_attn

    real = flash_attn.current_platform

    class CudaLike:
        def is_cuda(self) -> bool:
            return True

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    flash_attn.current_platform = CudaLike()


def xpu_facts(flash_attn: Any) -> dict[str, Any]:
    """The same FlashAttention on an XPU machine: vLLM's XPU platform picks FLASH_ATTN by default and validates
    nothing, so what the backend claims and what its forward does with mm rows is what an XPU user gets. The
    platform is the tree's own Platform with XPU's enum (the XPU platform module needs XPU kernels)."""
    from vllm.platforms.interface import Platform, PlatformEnum

    class XpuLike(Platform):
        _enum = PlatformEnum.XPU
        device_type = "xpu"

    saved = flash_attn.current_platform
    flash_attn.current_platform = XpuLike()
    try:
        backend = flash_attn.FlashAttentionBackend
        per_head = getattr(backend, "supports_mm_prefix_for_head_size", None)
        out: dict[str, Any] = {
            "supports_mm_prefix": backend.supports_mm_prefix(),
            "for_head_256": None if per_head is None else per_head(256),
        }
        rng = random.Random(17)
        calls = []
        for _ in range(4):
            batch = ref.random_batch(rng, with_ranges=True, head_size=32, block_size=16)
            recorder = ref.Recorder()
            flash_attn.flash_attn_varlen_func = recorder
            impl = make_impl(flash_attn, None)
            metadata = make_metadata(flash_attn, batch)
            set_ranges(flash_attn, metadata, batch)
            layer = SimpleNamespace(_q_scale=torch.ones(1), _k_scale=torch.ones(1), _v_scale=torch.ones(1))
            layer.mm_prefix_clamp_sliding_window = False
            q = batch.query
            impl.forward(layer, q, q, q, kv_cache_for(flash_attn, batch), metadata, torch.zeros_like(q))
            calls.append([c["causal"] for c in recorder.calls])
        out["forward_calls"] = calls
        return out
    finally:
        flash_attn.current_platform = saved


def runner_ranges_facts(flash_attn: Any) -> dict[str, Any] | None:
    """0.21.0: the model runner hands every metadata object a range list per request after build, an empty one
    for a text-only request and the prompt's ranges for a request decoding after its image. Such a batch has no
    row inside a range: it must run as a text-only batch does (the same calls, no DCP/ALiBi refusal, and no
    scan of rows per layer). Trees whose builder records the rows (0.26.0 on) report None."""
    if "mm_prefix_range" not in flash_attn.FlashAttentionMetadata.__dataclass_fields__:
        return None
    from vllm.v1.attention.backends import mm_prefix_fa

    scans = [0]
    # the module's own function: flash_attn places rows through mm_prefix_fa (step_mm_prefix_spans from v10)
    owner = flash_attn if hasattr(flash_attn, "mm_prefix_spans") else mm_prefix_fa
    real_spans = owner.mm_prefix_spans

    def counted(*args: Any, **kwargs: Any) -> Any:
        scans[0] += 1
        return real_spans(*args, **kwargs)

    owner.mm_prefix_spans = counted
    rng = random.Random(13)
    out: dict[str, Any] = {"calls": [], "refused": [], "text_scans": 0}
    for trial in range(6):
        batch = ref.random_batch(rng, with_ranges=False, head_size=32, block_size=16)
        past = trial % 2 == 1  # decodes after their image: ranges all before the scheduled rows
        if past:
            batch.query_lens = [1] * len(batch.seq_lens)
            batch.query = batch.query[: len(batch.seq_lens)]
        ranges = {r: ([(0, max(0, n - 2))] if past and n > 2 else []) for r, n in enumerate(batch.seq_lens)}
        recorder = ref.Recorder()
        flash_attn.flash_attn_varlen_func = recorder
        impl = make_impl(flash_attn, [None, 5][trial % 2])
        layer = SimpleNamespace(_q_scale=torch.ones(1), _k_scale=torch.ones(1), _v_scale=torch.ones(1))
        kv_cache = kv_cache_for(flash_attn, batch)
        metadata = make_metadata(flash_attn, batch)
        metadata.mm_prefix_range = ranges
        metadata.query_start_loc_cpu = torch.tensor(batch.query_starts, dtype=torch.int32)
        metadata.seq_lens_cpu = torch.tensor(batch.seq_lens, dtype=torch.int32)
        before = scans[0]
        q = batch.query
        for _ in range(3):  # three layers of one batch
            impl.forward(layer, q, q, q, kv_cache, metadata, torch.zeros_like(q))
        if not past:
            out["text_scans"] += scans[0] - before
        out["calls"].append(len(recorder.calls))
        out["refused"].append(
            {what: refusal is not None and "TRITON_ATTN" in refusal
             for what, refusal in refusals(impl, layer, batch.query, kv_cache, metadata).items()}
        )
    owner.mm_prefix_spans = real_spans
    return out


def refusals(impl: Any, layer: Any, query: torch.Tensor, kv_cache: torch.Tensor, metadata: Any) -> dict[str, Any]:
    """The same mm batch with decode context parallel, then with ALiBi: where the recompute cannot be exact the
    forward must refuse (NotImplementedError's text), not return rows that are silently causal or misaligned."""
    out: dict[str, Any] = {}
    for what in ("dcp", "alibi"):
        saved = impl.dcp_world_size, impl.alibi_slopes
        if what == "dcp":
            impl.dcp_world_size = 2
        else:
            impl.alibi_slopes = torch.ones(impl.num_heads)
        try:
            impl.forward(layer, query, query, query, kv_cache, metadata, torch.zeros_like(query))
            out[what] = None
        except NotImplementedError as exc:
            out[what] = str(exc)
        except Exception as exc:  # e.g. the DCP path without a DCP group: not a refusal
            out[what] = f"not refused: {type(exc).__name__}"
        impl.dcp_world_size, impl.alibi_slopes = saved
    return out


def auto_selection() -> None:
    """What the tree's own CUDA platform picks for an mm-prefix model when nobody names a backend, and whether
    naming FLASH_ATTN is accepted, on SM80/SM90/SM120 with FA2/FA3 (no FA4). Only the compiled extension
    modules, which cannot exist on a CPU machine, are stood in for."""
    import types

    for name in ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C"):
        sys.modules.setdefault(name, types.ModuleType(name))
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends import flash_attn
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    flash_attn.is_flash_attn_varlen_func_available = lambda: True
    flash_attn.is_fa_version_supported = lambda version: version != 4
    picked: dict[str, Any] = {}
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        for cap in ((8, 0), (9, 0), (12, 0)):
            for mm in (True, False):
                cfg = AttentionSelectorConfig(head_size=256, dtype=torch.bfloat16, kv_cache_dtype="auto",
                                              block_size=16, use_mm_prefix=mm)
                valid, _ = CudaPlatform.get_valid_backends(
                    device_capability=DeviceCapability(*cap), attn_selector_config=cfg, num_heads=8)
                first = valid[0]  # 0.21.0: (enum, priority); 0.33.0: a candidate with .backend
                enum = first.backend if hasattr(first, "backend") else first[0]
                picked[f"sm{cap[0]}{cap[1]}-{'mm' if mm else 'text'}"] = enum.name
        cfg = AttentionSelectorConfig(head_size=256, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16,
                                      use_mm_prefix=True)
        CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(12, 0))
        try:
            CudaPlatform.get_attn_backend_cls(AttentionBackendEnum.FLASH_ATTN, cfg, num_heads=8)
            explicit: str | None = None
        except ValueError as exc:
            explicit = str(exc)
    facts["auto_backend"] = picked
    facts["explicit_flash_attn_mm_refused"] = explicit
    # FA4 installed where the layers run FA3 (SM90): the recompute still runs, so full graphs stay capped.
    flash_attn.is_fa_version_supported = lambda version: True
    if hasattr(flash_attn, "get_flash_attn_version"):
        flash_attn.get_flash_attn_version = lambda *a, **k: 3
    builder = flash_attn.FlashAttentionMetadataBuilder
    from vllm.v1.attention.backend import AttentionCGSupport

    builder._cudagraph_support = AttentionCGSupport.ALWAYS
    facts["fa_cudagraph_fa4_installed_fa3_running"] = builder.get_cudagraph_support(
        SimpleNamespace(model_config=SimpleNamespace(is_mm_prefix_lm=True)),
        SimpleNamespace(head_size=256, block_size=16),
    ).name
    facts["fa_cudagraph_config_forces_fa2"] = cudagraph_cap_under_config(flash_attn)


def cudagraph_cap_under_config(flash_attn: Any) -> dict[str, str] | None:
    """An SM100 with FA4 installed where the user's config forces FA2 (attention_config.flash_attn_version=2): the
    layers are built under that config and run FA2, so the mm rows are recomputed and full CUDA graphs must stay
    capped, whether or not a config is current when the runner asks for the cap. The tree's own
    get_flash_attn_version decides; stood in: the compiled FlashAttention's answers (every version installed)
    and the device capability (10.0)."""
    import types

    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends import fa_utils

    if not hasattr(flash_attn, "_layers_run_fa4"):
        return None  # trees without the series' FA4 check (pristine, 0.21.0)
    interface = types.ModuleType("vllm.vllm_flash_attn.flash_attn_interface")
    interface.is_fa_version_supported = lambda version, device=None: True  # type: ignore[attr-defined]
    interface.fa_version_unsupported_reason = lambda version, device=None: None  # type: ignore[attr-defined]
    sys.modules["vllm.vllm_flash_attn.flash_attn_interface"] = interface
    real = fa_utils.current_platform

    class Sm100:
        def get_device_capability(self, device_id: int = 0) -> Any:
            return DeviceCapability(10, 0)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    fa_utils.current_platform = Sm100()
    flash_attn.get_flash_attn_version = fa_utils.get_flash_attn_version
    flash_attn.is_fa_version_supported = lambda version: True
    from vllm.config import set_current_vllm_config

    config = SimpleNamespace(
        model_config=SimpleNamespace(is_mm_prefix_lm=True, is_diffusion=False),
        attention_config=SimpleNamespace(flash_attn_version=2),
    )
    spec = SimpleNamespace(head_size=128, block_size=16)
    builder = flash_attn.FlashAttentionMetadataBuilder
    out = {"no_current_config": builder.get_cudagraph_support(config, spec).name}
    with set_current_vllm_config(config):  # type: ignore[arg-type]
        out["config_current"] = builder.get_cudagraph_support(config, spec).name
        out["layer_version"] = fa_utils.get_flash_attn_version(head_size=128)
    return out


def kv_cache_for(flash_attn: Any, batch: ref.MMBatch) -> torch.Tensor:
    """The tree's own KV cache layout, filled with the batch's keys and values."""
    get_shape = getattr(flash_attn.FlashAttentionBackend, "get_kv_cache_shape", None)
    if get_shape is not None and get_shape(*batch.key_cache.shape)[0] == 2:
        # [2, blocks, block_size, heads, size]
        return torch.stack([batch.key_cache, batch.value_cache])
    # [blocks, heads, block_size, 2 * size]
    return torch.cat([batch.key_cache, batch.value_cache], dim=-1).transpose(1, 2).contiguous()


as_cuda_machine()
decoupling()
per_kind()
flash_attention()
auto_selection()
print("SERIES_A_FACTS " + json.dumps(facts))
