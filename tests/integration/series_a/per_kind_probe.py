"""Runs inside a vLLM source tree (PYTHONPATH=<tree>) and prints one JSON object: the attention backend each
layer of a model gets when the tree's own model code builds it, for several attention configs.

Usage: python per_kind_probe.py WORKDIR (configs are written there; a WORKDIR/cli_args.json of argv words, if
present, goes through the tree's own `vllm serve` argument parser).

Models (configs only; the layers are built on the meta device, nothing is loaded):

- the tiny Gemma 4 of tests/gpu/e2e/tiny_models.py (its text config: sliding layers of head_dim 256 and window
  128, full layers of global_head_dim 512, ``use_bidirectional_attention: vision``, so the tree's
  Gemma4ModelArchConfigConvertor makes it a multimodal-prefix model), as ``Gemma4ForCausalLM``: the decoder
  layers are what Gemma4ForConditionalGeneration builds for its language model; its vision tower (which needs
  torchvision, not among the CPU test requirements) chooses no decoder backend. 0.21.0 reads ``global_head_dim``
  (put back with hf_overrides, as engine_runs.py does); 0.33.0 reads transformers' per-layer config.
- a tiny Gemma 3 language model with the multimodal-prefix flag its multimodal checkpoints get (model_type
  gemma3 is in the trees' mm-prefix list; here the flag is set on the text config, the convertor's first source):
  sliding and full layers, both of head_dim 256.

What is replaced, because it cannot exist on a CPU machine: the CUDA platform resolves each layer's backend (the
machine's platform is CPU) at compute capability 12.0 (SM120) with the FA2 varlen kernel present and FA4 absent,
and the compiled extension modules are empty stand-ins. The selection itself, the backends' validation, the
layers, Gemma4Config and the model code are the tree's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import types
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[3]
WORK = Path(sys.argv[1])
os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
for _name in ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C"):
    sys.modules.setdefault(_name, types.ModuleType(_name))

import vllm  # noqa: E402

V021 = vllm.__version__.startswith("0.21.")
SLIDING_FA = {"backend_per_kind": {"sliding_window": "FLASH_ATTN"}}


def gemma4_dir() -> tuple[Path, dict[str, Any]]:
    sys.path.insert(0, str(REPO / "tests" / "gpu" / "e2e"))
    import tiny_models

    config = tiny_models.text_config()
    config["architectures"] = ["Gemma4ForCausalLM"]
    overrides: dict[str, Any] = {}
    if V021:
        overrides = {"global_head_dim": tiny_models.GLOBAL_HEAD_DIM}
    else:
        config.pop("per_layer_config")  # transformers then keeps global_head_dim per layer, where 0.33.0 reads it
    folder = WORK / "gemma4"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder, overrides


def gemma3_dir() -> Path:
    config = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": 1024,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "sliding_window": 128,
        "max_position_embeddings": 4096,
        "query_pre_attn_scalar": 256,
        "is_mm_prefix_lm": True,
        "torch_dtype": "bfloat16",
    }
    folder = WORK / "gemma3"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def on_sm120() -> None:
    """The CUDA platform resolves backends (SM120, FA2 present, no FA4); everything else stays on CPU."""
    # Imported under the CPU platform: their import-time checks must not ask for CUDA kernels.
    import vllm.compilation.backends
    import vllm.model_executor.models.gemma3
    import vllm.model_executor.models.gemma4  # noqa: F401
    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends import flash_attn, triton_attn  # noqa: F401

    flash_attn.is_flash_attn_varlen_func_available = lambda: True
    flash_attn.is_fa_version_supported = lambda version: version != 4
    real = flash_attn.current_platform

    class CudaLike:  # FlashAttention's own platform questions (is_cuda: the mm-prefix recompute is CUDA's)
        def is_cuda(self) -> bool:
            return True

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    flash_attn.current_platform = CudaLike()
    CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(12, 0))
    resolve = selector._cached_get_attn_backend.__wrapped__

    def on_cuda(*args: Any, **kwargs: Any) -> Any:
        saved = platforms._current_platform
        platforms._current_platform = CudaPlatform()
        try:
            return resolve(*args, **kwargs)
        finally:
            platforms._current_platform = saved

    selector._cached_get_attn_backend = on_cuda


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_config(model: Path, overrides: dict[str, Any], attention: dict[str, Any]) -> Any:
    from vllm.config import AttentionConfig, DeviceConfig, ModelConfig, VllmConfig

    model_config = ModelConfig(
        model=str(model), skip_tokenizer_init=True, max_model_len=1024, dtype="bfloat16", hf_overrides=overrides
    )
    return VllmConfig(
        model_config=model_config,
        device_config=DeviceConfig(device="cpu"),
        attention_config=AttentionConfig(**attention),
    )


def layers(config: Any, cls: type) -> list[dict[str, Any]]:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention

    torch.set_default_dtype(torch.bfloat16)
    with set_current_vllm_config(config), torch.device("meta"):
        model = cls(vllm_config=config, prefix="")
    out = []
    for name, module in model.named_modules():
        if not isinstance(module, Attention):
            continue
        backend = module.attn_backend
        by_recompute = getattr(backend, "mm_prefix_by_recompute", None)
        out.append({
            "name": name,
            "head_size": module.head_size,
            "sliding_window": module.sliding_window,
            "backend": backend.get_name(),
            "mm_prefix": module.use_mm_prefix,
            "recompute": None if by_recompute is None else bool(by_recompute(module.head_size)),
            "impl": module.impl,
            "layer": module,
        })
    return out


def case(model: Path, overrides: dict[str, Any], attention: dict[str, Any], cls: type) -> dict[str, Any]:
    result: dict[str, Any] = {"config_error": None, "error": None, "backend": None, "layers": None}
    try:
        config = build_config(model, overrides, attention)
    except Exception as exc:  # the tree refuses the attention config itself
        result["config_error"] = f"{type(exc).__name__}: {exc}"
        return result
    backend = config.attention_config.backend
    result["backend"] = None if backend is None else backend.name
    result["per_kind"] = {k: v.name for k, v in getattr(config.attention_config, "backend_per_kind", {}).items()}
    try:
        built = layers(config, cls)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        return result
    result["layers"] = [{k: v for k, v in layer.items() if k not in ("impl", "layer")} for layer in built]
    result["_built"] = built
    result["_config"] = config
    return result


def v2_refusal(config: Any) -> str | None:
    """0.21.0's V2 runner keeps each backend's own KV view of the shared pool: it must refuse per-kind backends."""
    validate = getattr(config, "_validate_v2_model_runner", None)
    if validate is None:
        return "no V2 validation in this tree"
    try:
        validate()
    except ValueError as exc:
        return str(exc)
    return None


def mm_refusals(built: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A Gemma 4 sliding layer's FlashAttentionImpl (as the model built it) on a batch with an image range, once
    with decode context parallel and once with ALiBi: the forward must refuse with the series' message. None
    when no layer got FlashAttention."""
    from vllm.v1.attention.backends import flash_attn

    sliding = next((layer for layer in built if layer["backend"] == "FLASH_ATTN"), None)
    if sliding is None:
        return None
    impl, layer = sliding["impl"], sliding["layer"]
    impl.vllm_flash_attn_version = 2
    heads, kv_heads, size = impl.num_heads, impl.num_kv_heads, impl.head_size
    tokens, block = 12, 16
    starts = torch.tensor([0, tokens], dtype=torch.int32)
    fields: dict[str, Any] = {
        "num_actual_tokens": tokens,
        "max_query_len": tokens,
        "query_start_loc": starts,
        "max_seq_len": tokens,
        "seq_lens": torch.tensor([tokens], dtype=torch.int32),
        "block_table": torch.zeros(1, 1, dtype=torch.int32),
        "slot_mapping": torch.arange(tokens),
    }
    if "use_cascade" in flash_attn.FlashAttentionMetadata.__dataclass_fields__:
        fields.update(use_cascade=False, common_prefix_len=0, cu_prefix_query_lens=None, prefix_kv_lens=None,
                      suffix_kv_lens=None)
    metadata = flash_attn.FlashAttentionMetadata(**fields)
    ranges = {0: [(2, 8)]}
    if "mm_prefix_range" in flash_attn.FlashAttentionMetadata.__dataclass_fields__:
        metadata.mm_prefix_range = ranges
        metadata.query_start_loc_cpu = starts
        metadata.seq_lens_cpu = metadata.seq_lens
    if "mm_prefix_spans" in flash_attn.FlashAttentionMetadata.__dataclass_fields__:
        from vllm.v1.attention.backends.mm_prefix_fa import mm_prefix_spans

        metadata.mm_prefix_spans = mm_prefix_spans(ranges, starts, metadata.seq_lens)
    query = torch.zeros(tokens, heads, size)
    get_shape = getattr(flash_attn.FlashAttentionBackend, "get_kv_cache_shape", None)
    # The tree's own layout: 0.21.0 (2, blocks, block, heads, size); 0.33.0 (blocks, heads, block, 2 * size).
    shape = get_shape(1, block, kv_heads, size) if get_shape is not None else (1, kv_heads, block, 2 * size)
    kv_cache = torch.zeros(shape)
    scales = types.SimpleNamespace(_q_scale=torch.ones(1), _k_scale=torch.ones(1), _v_scale=torch.ones(1),
                                   mm_prefix_clamp_sliding_window=getattr(layer, "mm_prefix_clamp_sliding_window",
                                                                          False))
    out: dict[str, Any] = {"window": list(impl.sliding_window), "head_size": size}
    for what in ("dcp", "alibi"):
        saved = impl.dcp_world_size, impl.alibi_slopes
        if what == "dcp":
            impl.dcp_world_size = 2
        else:
            impl.alibi_slopes = torch.ones(heads)
        try:
            impl.forward(scales, query, query, query, kv_cache, metadata, torch.zeros_like(query))
            out[what] = None
        except NotImplementedError as exc:
            out[what] = str(exc)
        except Exception as exc:
            out[what] = f"not refused: {type(exc).__name__}: {exc}"
        impl.dcp_world_size, impl.alibi_slopes = saved
    return out


def cli_case() -> dict[str, Any] | None:
    """WORK/cli_args.json (argv words a test rendered, e.g. a recipe's --attention-config) through the tree's own
    `vllm serve` argument parser and EngineArgs: the attention config vLLM would run with, or the refusal."""
    path = WORK / "cli_args.json"
    if not path.is_file():
        return None
    words = json.loads(path.read_text())
    import io

    import vllm.platforms as platforms
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms.cuda import CudaPlatform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    saved = platforms._current_platform
    platforms._current_platform = CudaPlatform()  # the parser's defaults ask for the device type
    stderr = io.StringIO()
    try:
        parser = FlexibleArgumentParser()
        EngineArgs.add_cli_args(parser)
        with contextlib.redirect_stderr(stderr):
            namespace = parser.parse_args(words)
        config = EngineArgs.from_cli_args(namespace).attention_config
        per_kind = getattr(config, "backend_per_kind", None)
        return {"words": words, "error": None,
                "backend_per_kind": None if per_kind is None else {k: v.name for k, v in per_kind.items()},
                "backend": None if config.backend is None else config.backend.name}
    except (Exception, SystemExit) as exc:
        return {"words": words, "error": f"{type(exc).__name__}: {exc} {stderr.getvalue()[-1500:]}"}
    finally:
        platforms._current_platform = saved


def main() -> None:
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    gemma4, overrides = gemma4_dir()
    gemma3 = gemma3_dir()
    on_sm120()
    from vllm.model_executor.models.gemma3 import Gemma3ForCausalLM
    from vllm.model_executor.models.gemma4 import Gemma4ForCausalLM

    first = build_config(gemma4, overrides, {})
    with set_current_vllm_config(first):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
        initialize_model_parallel(1, 1)

    cases = {
        "gemma4": (gemma4, overrides, {}, Gemma4ForCausalLM),
        "gemma4_sliding_fa": (gemma4, overrides, SLIDING_FA, Gemma4ForCausalLM),
        "gemma4_full_fa": (gemma4, overrides, {"backend_per_kind": {"full_attention": "FLASH_ATTN"}},
                           Gemma4ForCausalLM),
        "gemma4_unknown_kind": (gemma4, overrides, {"backend_per_kind": {"sliding": "FLASH_ATTN"}},
                                Gemma4ForCausalLM),
        "gemma3": (gemma3, {}, {}, Gemma3ForCausalLM),
    }
    facts: dict[str, Any] = {"version": vllm.__version__}
    for name, (model, hf_overrides, attention, cls) in cases.items():
        result = case(model, hf_overrides, attention, cls)
        built, config = result.pop("_built", None), result.pop("_config", None)
        if name == "gemma4_sliding_fa" and built is not None:
            result["refusals"] = mm_refusals(built)
            result["v2_runner"] = v2_refusal(config) if V021 else None
        facts[name] = result
    facts["cli"] = cli_case()
    print("PER_KIND_FACTS " + json.dumps(facts))


with contextlib.suppress(BrokenPipeError):
    main()
