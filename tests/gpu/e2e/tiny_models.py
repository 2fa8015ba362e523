"""Tiny Gemma 4 models for the vLLM 0.21.0 e2e runs: no downloads, no weights, deterministic.

  python tests/gpu/e2e/tiny_models.py OUTDIR

writes

  OUTDIR/target/  Gemma4ForConditionalGeneration (model_type gemma4: text_config + vision_config, no audio).
                  Text layers mix sliding attention (head_dim 256) and full attention (global_head_dim 512), so
                  vLLM 0.21.0's Gemma4Config (vllm/model_executor/models/config.py) forces TRITON_ATTN for the
                  target, and text_config.use_bidirectional_attention == "vision" makes is_mm_prefix_lm true
                  (Gemma4ModelArchConfigConvertor). Tokenizer (WordLevel tokenizer.json), tokenizer_config.json
                  with Gemma 4's named special tokens, processor_config.json (Gemma4Processor with its image,
                  audio and video sub-processors), generation_config.json.
  OUTDIR/dflash/  DFlashDraftModel (qwen3 layout, as z-lab's drafters): hidden size and vocab of the target,
                  layer_types mixing sliding_attention and full_attention, head_dim 128 (FlashAttention serves
                  it), dflash_config {mask_token_id, target_layer_ids}.
  OUTDIR/mtp/     gemma4_assistant drafter (vLLM 0.21.0 maps it to Gemma4MTPModel): one full-attention layer
                  that reads the target's last full layer's KV cache (same kv heads, head_dim 512).
  OUTDIR/meta.json what engine_runs.py needs to know (token ids, hf_overrides, why a drafter is absent).

No weights are written: the runs use load_format="dummy" (vllm/model_executor/model_loader/dummy_loader.py never
reads a checkpoint). Standard library only, so it runs with any python3; when transformers is importable it also
checks that the configs, tokenizer and processor load (--check, on by default when available; failures there
are reported, not fatal, unless --strict).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------------------------
# Vocabulary: Gemma 4's named special tokens first, then plain words. vocab_size is the model's embedding size.
# ---------------------------------------------------------------------------------------------------------------
VOCAB_SIZE = 1024
SPECIAL_TOKENS = [
    "<pad>",  # 0  pad_token_id (Gemma4TextConfig default 0)
    "<eos>",  # 1  eos_token_id (default 1)
    "<bos>",  # 2  bos_token_id (default 2)
    "<unk>",  # 3
    "<mask>",  # 4  DFlash mask token (dflash_config.mask_token_id)
    "<|image|>",  # 5  image soft token: image_token_id, the placeholder vLLM replaces (Gemma4Processor.image_token)
    "<|image>",  # 6  boi_token_id
    "<image|>",  # 7  eoi_token_id
    "<|audio|>",  # 8  audio_token_id
    "<|audio>",  # 9  boa_token_id
    "<audio|>",  # 10 eoa_token_index
    "<|video|>",  # 11 video_token_id (Gemma4Processor adds it as a special token: it must already exist)
    "<start_of_turn>",  # 12
    "<end_of_turn>",  # 13
]
IDS = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
FIRST_WORD_ID = 16
WORDS = [f"w{i}" for i in range(FIRST_WORD_ID, VOCAB_SIZE)]
FILLER = [f"<unused{i}>" for i in range(len(SPECIAL_TOKENS), FIRST_WORD_ID)]  # ids 14, 15

# Target geometry (text). Sliding layers: 1 KV head x 256; full layers: 1 KV head x 512 (Gemma 4 31B has 16x256
# sliding and 4x512 full: the same 2:1 per-token KV ratio between the kinds).
HIDDEN = 256
TEXT_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
HEAD_DIM = 256
GLOBAL_HEAD_DIM = 512
NUM_HEADS = 2
NUM_KV_HEADS = 1
SLIDING_WINDOW = 128  # smaller than several prompts, so the window matters
SOFTCAP = 30.0  # Gemma 4's final_logit_softcapping
MAX_POS = 4096

# Vision tower: tiny, patch 16, pooling 3; 70 soft tokens per image at most (a supported max_soft_tokens value).
MAX_SOFT_TOKENS = 70
PATCH = 16
POOL = 3

# DFlash drafter.
DFLASH_LAYER_TYPES = ["sliding_attention", "full_attention"]
DFLASH_HEAD_DIM = 128
DFLASH_TARGET_LAYER_IDS = [1, 3]

# Gemma 4 MTP assistant: one full-attention layer, KV-shared with the target's last full layer.
MTP_HIDDEN = 128


def text_config() -> dict[str, Any]:
    return {
        "model_type": "gemma4_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": 512,
        "num_hidden_layers": len(TEXT_LAYER_TYPES),
        "layer_types": list(TEXT_LAYER_TYPES),
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        # transformers 5.17's Gemma4TextConfig.__post_init__ pops global_head_dim (into per_layer_config), so
        # the attribute is gone; vLLM 0.21.0 reads `global_head_dim` only (gemma4.py Gemma4DecoderLayer,
        # config.py Gemma4Config, Gemma4ModelArchConfigConvertor.get_head_size). engine_runs.py puts it back
        # with hf_overrides (meta.json "target_hf_overrides"); with an older transformers it is simply kept.
        "global_head_dim": GLOBAL_HEAD_DIM,
        # transformers 5.17's Gemma4TextConfig otherwise turns global_head_dim into a heterogeneous
        # per_layer_config, and then *reading* text_config.head_dim raises AmbiguousGlobalPerLayerAttributeError
        # (integrations/heterogeneity): vLLM 0.21.0 reads head_dim in Gemma4ModelArchConfigConvertor and
        # could not build a ModelConfig at all. An explicit null keeps the config homogeneous.
        "per_layer_config": None,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-6,
        "pad_token_id": IDS["<pad>"],
        "eos_token_id": IDS["<eos>"],
        "bos_token_id": IDS["<bos>"],
        "tie_word_embeddings": True,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "sliding_window": SLIDING_WINDOW,
        "final_logit_softcapping": SOFTCAP,
        # The multimodal-prefix flag: vLLM 0.21.0's Gemma4ModelArchConfigConvertor.is_mm_prefix_lm is
        # `text_config.use_bidirectional_attention == "vision"`.
        "use_bidirectional_attention": "vision",
        # No per-layer embeddings (as Gemma 4 31B / 26B-A4B): 0 disables PLE in vLLM's Gemma4Model.
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": VOCAB_SIZE,
        "attention_k_eq_v": False,
        "num_kv_shared_layers": 0,
        "enable_moe_block": False,
        "use_double_wide_mlp": False,
        "dtype": "bfloat16",
    }


def vision_config() -> dict[str, Any]:
    return {
        "model_type": "gemma4_vision",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": MAX_POS,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "pooling_kernel_size": POOL,
        "patch_size": PATCH,
        "position_embedding_size": 1024,
        "use_clipped_linears": False,
        "standardize": False,
        # Read by vLLM 0.21.0 (gemma4_mm.py Gemma4ProcessingInfo.get_mm_max_tokens_per_item and
        # _compute_num_soft_tokens); published Gemma 4 configs carry it in vision_config.
        "default_output_length": MAX_SOFT_TOKENS,
        "dtype": "bfloat16",
    }


def target_config() -> dict[str, Any]:
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text_config(),
        "vision_config": vision_config(),
        "audio_config": None,
        "boi_token_id": IDS["<|image>"],
        "eoi_token_id": IDS["<image|>"],
        "image_token_id": IDS["<|image|>"],
        "video_token_id": IDS["<|video|>"],
        "boa_token_id": IDS["<|audio>"],
        "eoa_token_index": IDS["<audio|>"],
        "audio_token_id": IDS["<|audio|>"],
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
        "transformers_version": "5.17.0",
    }


def dflash_config() -> dict[str, Any]:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "target_hidden_size": HIDDEN,
        "intermediate_size": 512,
        "num_hidden_layers": len(DFLASH_LAYER_TYPES),
        "layer_types": list(DFLASH_LAYER_TYPES),
        # transformers' Qwen3Config keeps sliding_window only when use_sliding_window is true; the patched
        # qwen3_dflash.py (dflash_layer_attention) takes the window from dflash_config.swa_window_size or
        # sliding_window.
        "use_sliding_window": True,
        "sliding_window": SLIDING_WINDOW,
        "max_window_layers": len(DFLASH_LAYER_TYPES),
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": DFLASH_HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": IDS["<bos>"],
        "eos_token_id": IDS["<eos>"],
        "pad_token_id": IDS["<pad>"],
        "block_size": 16,
        "num_target_layers": len(TEXT_LAYER_TYPES),
        "dflash_config": {
            "mask_token_id": IDS["<mask>"],
            "target_layer_ids": list(DFLASH_TARGET_LAYER_IDS),
        },
        "dtype": "bfloat16",
        "transformers_version": "5.17.0",
    }


def mtp_config() -> dict[str, Any]:
    return {
        "architectures": ["Gemma4AssistantForCausalLM"],
        "model_type": "gemma4_assistant",
        "backbone_hidden_size": HIDDEN,
        "use_ordered_embeddings": False,
        "num_centroids": 32,
        "centroid_intermediate_top_k": 4,
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "gemma4_text",
            "vocab_size": VOCAB_SIZE,
            "hidden_size": MTP_HIDDEN,
            "intermediate_size": 256,
            "num_hidden_layers": 1,
            "layer_types": ["full_attention"],
            "num_attention_heads": NUM_HEADS,
            "num_key_value_heads": NUM_KV_HEADS,
            # One full layer only: head_dim == global_head_dim == the target's full-layer head size, so the
            # KV-shared layer matches the target's cache whether or not transformers keeps global_head_dim.
            "head_dim": GLOBAL_HEAD_DIM,
            "global_head_dim": GLOBAL_HEAD_DIM,
            "per_layer_config": None,  # see text_config(): keeps head_dim readable under transformers 5.17
            "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": MAX_POS,
            "rms_norm_eps": 1e-6,
            "pad_token_id": IDS["<pad>"],
            "eos_token_id": IDS["<eos>"],
            "bos_token_id": IDS["<bos>"],
            "tie_word_embeddings": True,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {
                    "rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                },
            },
            "attention_bias": False,
            "attention_dropout": 0.0,
            "sliding_window": SLIDING_WINDOW,
            "final_logit_softcapping": SOFTCAP,
            "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 0,
            "attention_k_eq_v": False,
            "num_kv_shared_layers": 1,
            "enable_moe_block": False,
            "use_double_wide_mlp": False,
            "dtype": "bfloat16",
        },
        "dtype": "bfloat16",
        "transformers_version": "5.17.0",
    }


def generation_config() -> dict[str, Any]:
    return {
        "bos_token_id": IDS["<bos>"],
        "eos_token_id": IDS["<eos>"],
        "pad_token_id": IDS["<pad>"],
        "do_sample": False,
        "transformers_version": "5.17.0",
    }


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer and processor
# ---------------------------------------------------------------------------------------------------------------
def tokenizer_json() -> dict[str, Any]:
    vocab: dict[str, int] = {}
    for i, tok in enumerate(SPECIAL_TOKENS + FILLER + WORDS):
        vocab[tok] = i
    assert len(vocab) == VOCAB_SIZE
    added = [
        {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for i, tok in enumerate(SPECIAL_TOKENS)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [IDS["<bos>"]], "tokens": ["<bos>"]}},
        },
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": MAX_POS,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        # Named special tokens: tokenizer.image_token / .image_token_id etc., which Gemma4Processor.__init__
        # reads (image_token_id, boi_token, eoi_token, image_token; audio_token, boa_token, eoa_token: its
        # validate_inputs refuses any call when boa_token or eoa_token is None).
        "extra_special_tokens": {
            "image_token": "<|image|>",
            "boi_token": "<|image>",
            "eoi_token": "<image|>",
            "audio_token": "<|audio|>",
            "boa_token": "<|audio>",
            "eoa_token": "<audio|>",
        },
    }


def processor_config() -> dict[str, Any]:
    image = {
        "image_processor_type": "Gemma4ImageProcessor",
        "do_convert_rgb": True,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": False,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
        "resample": 3,
        "patch_size": PATCH,
        "max_soft_tokens": MAX_SOFT_TOKENS,
        "pooling_kernel_size": POOL,
    }
    video = {
        "video_processor_type": "Gemma4VideoProcessor",
        "do_convert_rgb": True,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": False,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
        "resample": 3,
        "patch_size": PATCH,
        "max_soft_tokens": MAX_SOFT_TOKENS,
        "pooling_kernel_size": POOL,
        "num_frames": 4,
        "do_sample_frames": False,
    }
    audio = {
        "feature_extractor_type": "Gemma4AudioFeatureExtractor",
        "sampling_rate": 16000,
        "feature_size": 128,
        "padding_value": 0.0,
        "return_attention_mask": True,
    }
    return {
        "processor_class": "Gemma4Processor",
        "image_seq_length": MAX_SOFT_TOKENS,
        "audio_seq_length": 750,
        "audio_ms_per_token": 40,
        "image_processor": image,
        "video_processor": video,
        "feature_extractor": audio,
    }


def meta() -> dict[str, Any]:
    return {
        "vocab_size": VOCAB_SIZE,
        "first_word_id": FIRST_WORD_ID,
        "special_ids": dict(IDS),
        "image_token": "<|image|>",
        "max_soft_tokens": MAX_SOFT_TOKENS,
        "text_layer_types": list(TEXT_LAYER_TYPES),
        "head_dim": HEAD_DIM,
        "global_head_dim": GLOBAL_HEAD_DIM,
        "sliding_window": SLIDING_WINDOW,
        "dflash_layer_types": list(DFLASH_LAYER_TYPES),
        "dflash_head_dim": DFLASH_HEAD_DIM,
        "dflash_target_layer_ids": list(DFLASH_TARGET_LAYER_IDS),
        # Put back what transformers >= 5.1x drops (see text_config()): vLLM ModelConfig._apply_dict_overrides
        # sets it on hf_config.text_config after loading and before the arch config is derived.
        "target_hf_overrides": {"text_config": {"global_head_dim": GLOBAL_HEAD_DIM}},
        "weights": "none: run with load_format='dummy'",
    }


def _dump(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def mtp_unavailable_reason() -> str | None:
    """Why no MTP drafter can be used with the transformers on this machine, or None."""
    try:
        from transformers import AutoConfig  # noqa: F401
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except Exception as exc:
        return f"transformers not importable here ({type(exc).__name__}); written anyway"
    if "gemma4_assistant" not in CONFIG_MAPPING:
        import transformers

        return f"transformers {transformers.__version__} does not know model type gemma4_assistant"
    return None


def write_all(outdir: Path) -> dict[str, Any]:
    outdir = Path(outdir)
    target = outdir / "target"
    _dump(target / "config.json", target_config())
    _dump(target / "generation_config.json", generation_config())
    _dump(target / "tokenizer.json", tokenizer_json())
    _dump(target / "tokenizer_config.json", tokenizer_config())
    _dump(target / "special_tokens_map.json", {
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "mask_token": "<mask>",
    })
    _dump(target / "processor_config.json", processor_config())
    _dump(outdir / "dflash" / "config.json", dflash_config())
    info = meta()
    reason = mtp_unavailable_reason()
    if reason is None or reason.endswith("written anyway"):
        _dump(outdir / "mtp" / "config.json", mtp_config())
        info["mtp"] = {"available": True, "note": reason}
    else:
        info["mtp"] = {"available": False, "reason": reason}
    _dump(outdir / "meta.json", info)
    return info


def check(outdir: Path) -> list[str]:
    """Load what was written with the transformers on this machine; returns problems (empty: fine)."""
    problems: list[str] = []
    try:
        import transformers
        from transformers import AutoConfig, AutoTokenizer
    except Exception as exc:
        return [f"transformers not importable: {exc}"]
    outdir = Path(outdir)
    try:
        cfg = AutoConfig.from_pretrained(outdir / "target")
        text = cfg.text_config
        if getattr(text, "use_bidirectional_attention", None) != "vision":
            problems.append("target text_config.use_bidirectional_attention is not 'vision'")
        if list(text.layer_types) != TEXT_LAYER_TYPES:
            problems.append(f"target layer_types became {text.layer_types}")
        if text.head_dim != HEAD_DIM:  # raises on a heterogeneous (per_layer_config) config
            problems.append(f"target text_config.head_dim is {text.head_dim}")
        if getattr(text, "is_heterogeneous", False):
            problems.append("target text_config is heterogeneous (per_layer_config): vLLM 0.21.0 cannot read it")
    except Exception as exc:
        problems.append(f"target config: {type(exc).__name__}: {exc}")
    try:
        tok = AutoTokenizer.from_pretrained(outdir / "target")
        ids = tok("w20 <|image|> w21").input_ids
        if ids != [IDS["<bos>"], 20, IDS["<|image|>"], 21]:
            problems.append(f"tokenizer encodes 'w20 <|image|> w21' as {ids}")
        if getattr(tok, "image_token_id", None) != IDS["<|image|>"]:
            problems.append(f"tokenizer.image_token_id is {getattr(tok, 'image_token_id', None)}")
    except Exception as exc:
        problems.append(f"tokenizer: {type(exc).__name__}: {exc}")
    try:
        from PIL import Image
        from transformers import AutoProcessor

        proc = AutoProcessor.from_pretrained(outdir / "target")
        img = Image.new("RGB", (160, 128), (120, 30, 200))
        out = proc(text=["w20 <|image|> w21"], images=[[img]], return_tensors="pt")
        n_img = int((out["input_ids"] == IDS["<|image|>"]).sum())
        if not (0 < n_img <= MAX_SOFT_TOKENS) or "pixel_values" not in out:
            problems.append(f"processor: {n_img} image tokens, keys {sorted(out.keys())}")
    except Exception as exc:
        problems.append(f"processor: {type(exc).__name__}: {exc}")
    try:
        d = AutoConfig.from_pretrained(outdir / "dflash")
        if list(d.layer_types) != DFLASH_LAYER_TYPES or d.sliding_window != SLIDING_WINDOW:
            problems.append(f"dflash config: layer_types {d.layer_types}, sliding_window {d.sliding_window}")
    except Exception as exc:
        problems.append(f"dflash config: {type(exc).__name__}: {exc}")
    if (outdir / "mtp" / "config.json").is_file():
        try:
            AutoConfig.from_pretrained(outdir / "mtp")
        except Exception as exc:
            problems.append(f"mtp config (transformers {transformers.__version__}): {type(exc).__name__}: {exc}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--no-check", action="store_true", help="skip loading the files with transformers")
    ap.add_argument("--strict", action="store_true", help="exit 1 when the transformers check finds problems")
    args = ap.parse_args(argv)
    info = write_all(args.outdir)
    print(f"wrote {args.outdir}: target, dflash" + (", mtp" if info["mtp"]["available"] else "")
          + ("" if info["mtp"]["available"] else f" (no mtp: {info['mtp']['reason']})"))
    if not args.no_check:
        problems = check(args.outdir)
        for p in problems:
            print(f"check: {p}")
        if not problems:
            print("check: configs, tokenizer and processor load with this transformers")
        info["check_problems"] = problems
        _dump(args.outdir / "meta.json", info)
        if problems and args.strict:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
