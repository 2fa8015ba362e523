"""Gemma 4 26B-A4B, its DFlash drafter and its MTP assistant at their published shapes: no download, no weights.

  python tests/gpu/e2e/real_size.py OUTDIR

writes

  OUTDIR/target/   Gemma4ForConditionalGeneration at the published google/gemma-4-26B-A4B-it shapes: 30 text layers
                   (25 sliding of head_dim 256 + 5 full of 512, five times [S,S,S,S,S,F]), hidden 2816, dense MLP
                   2112 beside a MoE of 128 experts (704 wide, top 8), 16 query heads, 8 KV heads on sliding layers
                   and 2 on full ones (attention_k_eq_v), window 1024, vocabulary 262144; the SigLIP-sized vision
                   tower (27 layers, 1152 wide). Tokenizer files are tiny_models.py's, the vocabulary extended with
                   plain words to 262144 ids so every id a random-weights model samples decodes.
  OUTDIR/dflash/   the published z-lab gemma-4-26B-A4B-it-DFlash shapes (qwen3 layout, 5 layers [S,S,S,S,F], window
                   2048, hidden 2816, 32 heads / 8 KV heads of 128, MLP 5632, target_layer_ids [1,6,11,17,22,27]).
  OUTDIR/mtp/      the published google/gemma-4-26B-A4B-it-assistant shapes (gemma4_assistant, 4 layers [S,S,S,F],
                   hidden 1024, MLP 8192, every layer reading the target's KV).
  OUTDIR/mtp-standin/  the same assistant with every layer full attention at the target's full-layer KV geometry
                   (head_dim 512, 2 KV heads): what vLLM 0.21.0 can describe under transformers >= 5.15 (see
                   MTP_STANDIN_WHY); its cost per draft is within the published one's (one more wide layer).
  OUTDIR/meta.json what the runs need (hf_overrides, token ids) and where every number came from.

No weights: the runs use load_format="dummy". Standard library only (tiny_models.py beside it likewise).
Where a number is not published anywhere readable offline it is listed in meta.json "not_published" with the value
used and why it cannot change a step's cost, never filled in silently.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import tiny_models as tm  # beside this script: python puts the script's folder on sys.path

# ---------------------------------------------------------------------------------------------------------------
# Where the numbers come from. No network here but the package registry, so the published config.json files were
# not read directly: each shape below is what several independent public sources quote from them (configs and
# verbatim fixtures in public repositories), and they agree. transformers' own classes carry none of the 26B-A4B
# numbers (their defaults are gemma-4-e2b's); its ep-plan comment does confirm num_global_key_value_heads=2.
# ---------------------------------------------------------------------------------------------------------------
SOURCES = {
    "target_text": "google/gemma-4-26B-A4B-it config.json text_config as quoted by several public repositories "
                   "(config parsers' fixtures, one trimmed verbatim from an MLX conversion at a pinned revision); "
                   "transformers' Gemma4TextConfig ep plan names num_global_key_value_heads=2 for this model",
    "target_vision": "the same config.json vision_config as quoted by public repositories (1152 wide, 27 layers, "
                     "4304 MLP, 16 heads of 72, position_embedding_size 10240, default_output_length 280)",
    "dflash": "z-lab/gemma-4-26B-A4B-it-DFlash config.json, quoted verbatim in a public repository's test",
    "mtp": "google/gemma-4-26B-A4B-it-assistant config.json as validated key by key by a public repository "
           "(with the safetensors payload size, 839,422,472 bytes of bf16: 419,711,236 parameters)",
    "published_counts": "the model card: 25.2B total / 3.8B active parameters (the language model), a vision "
                        "encoder of ~550M; the name says 26B total, A4B = ~4B active",
}

# Published counts (see SOURCES["published_counts"], SOURCES["mtp"]).
PUBLISHED = {
    "text_total": 25.2e9,
    "text_active": 3.8e9,
    "vision": 550e6,
    "name_total": 26e9,
    "name_active": 4e9,
    "mtp_params": 839_422_472 // 2,
}

VOCAB_SIZE = 262_144
HIDDEN = 2816
NUM_LAYERS = 30
TEXT_LAYER_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 5  # 25 sliding + 5 full, the last full
HEAD_DIM = 256
GLOBAL_HEAD_DIM = 512
NUM_HEADS = 16
NUM_KV_HEADS = 8
NUM_GLOBAL_KV_HEADS = 2  # full layers, attention_k_eq_v: one projection serves K and V
SLIDING_WINDOW = 1024
INTERMEDIATE = 2112  # the dense MLP every layer keeps beside its MoE block
NUM_EXPERTS = 128
TOP_K = 8
MOE_INTERMEDIATE = 704
MAX_POS = 262_144
SOFTCAP = 30.0

DFLASH_LAYER_TYPES = ["sliding_attention"] * 4 + ["full_attention"]
DFLASH_TARGET_LAYER_IDS = [1, 6, 11, 17, 22, 27]
DFLASH_WINDOW = 2048

MTP_LAYER_TYPES = ["sliding_attention"] * 3 + ["full_attention"]
MTP_HIDDEN = 1024
MTP_INTERMEDIATE = 8192

ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}

# Keys no readable source gives; the value used and why a step's cost cannot depend on it.
NOT_PUBLISHED = {
    "special token ids": "tiny_models.py's (pad 0, eos 1, bos 2, mask 4, image 5, ...), the tokenizer being "
                         "tiny_models.py's; the real ones (e.g. image 258880) index the same 262144-row embedding",
    "mtp num_centroids / centroid_intermediate_top_k": "transformers' defaults 2048 / 32; unused: the published "
                                                       "assistant has use_ordered_embeddings false",
    "mtp text_config max_position_embeddings": f"{MAX_POS}, the target's; sizes no weight",
}

MTP_STANDIN_WHY = (
    "transformers >= 5.15 pops global_head_dim and num_global_key_value_heads from a gemma4_text config, and vLLM "
    "0.21.0 builds a draft model config with no user hf_overrides (SpeculativeConfig.hf_config_override only), "
    "so its Gemma4MTP full layer would come out 256 wide with 8 KV heads against the target's 512 x 2 cache; "
    "vLLM >= 0.29 resolves per-layer geometry itself (transformers_utils/configs/gemma4.py)")


def text_config() -> dict[str, Any]:
    doc = tm.text_config()  # same keys as the tiny target, real sizes
    doc.update({
        "vocab_size": VOCAB_SIZE, "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": NUM_LAYERS, "layer_types": list(TEXT_LAYER_TYPES),
        "num_attention_heads": NUM_HEADS, "num_key_value_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM,
        "global_head_dim": GLOBAL_HEAD_DIM, "num_global_key_value_heads": NUM_GLOBAL_KV_HEADS,
        "attention_k_eq_v": True, "max_position_embeddings": MAX_POS, "sliding_window": SLIDING_WINDOW,
        "final_logit_softcapping": SOFTCAP, "rope_parameters": copy.deepcopy(ROPE),
        "vocab_size_per_layer_input": VOCAB_SIZE, "hidden_size_per_layer_input": 0,
        "enable_moe_block": True, "num_experts": NUM_EXPERTS, "top_k_experts": TOP_K,
        "moe_intermediate_size": MOE_INTERMEDIATE,
    })
    return doc


def vision_config() -> dict[str, Any]:
    doc = tm.vision_config()
    doc.update({
        "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
        "num_key_value_heads": 16, "head_dim": 72, "patch_size": 16, "pooling_kernel_size": 3,
        "position_embedding_size": 10240, "default_output_length": 280, "standardize": True,
        "use_clipped_linears": False, "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
    })
    return doc


def target_config() -> dict[str, Any]:
    doc = tm.target_config()
    doc.update({"text_config": text_config(), "vision_config": vision_config()})
    return doc


def dflash_config() -> dict[str, Any]:
    doc = tm.dflash_config()
    doc.update({
        "vocab_size": VOCAB_SIZE, "hidden_size": HIDDEN, "target_hidden_size": HIDDEN, "intermediate_size": 5632,
        "num_hidden_layers": len(DFLASH_LAYER_TYPES), "layer_types": list(DFLASH_LAYER_TYPES),
        "sliding_window": DFLASH_WINDOW, "max_window_layers": len(DFLASH_LAYER_TYPES),
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": MAX_POS,
        "final_logit_softcapping": SOFTCAP, "num_target_layers": NUM_LAYERS, "block_size": 16,
        "dflash_config": {"mask_token_id": tm.IDS["<mask>"], "target_layer_ids": list(DFLASH_TARGET_LAYER_IDS)},
    })
    return doc


def mtp_config() -> dict[str, Any]:
    doc = tm.mtp_config()
    doc["backbone_hidden_size"] = HIDDEN
    doc["text_config"].update({
        "vocab_size": VOCAB_SIZE, "hidden_size": MTP_HIDDEN, "intermediate_size": MTP_INTERMEDIATE,
        "num_hidden_layers": len(MTP_LAYER_TYPES), "layer_types": list(MTP_LAYER_TYPES),
        "num_kv_shared_layers": len(MTP_LAYER_TYPES), "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS, "num_global_key_value_heads": NUM_GLOBAL_KV_HEADS,
        "attention_k_eq_v": True, "head_dim": HEAD_DIM, "global_head_dim": GLOBAL_HEAD_DIM,
        "max_position_embeddings": MAX_POS, "sliding_window": SLIDING_WINDOW, "final_logit_softcapping": None,
        "rope_parameters": copy.deepcopy(ROPE),
    })
    return doc


def mtp_standin_config() -> dict[str, Any]:
    doc = mtp_config()
    doc["text_config"].update({
        "layer_types": ["full_attention"] * len(MTP_LAYER_TYPES), "head_dim": GLOBAL_HEAD_DIM,
        "num_key_value_heads": NUM_GLOBAL_KV_HEADS,
    })
    return doc


def tokenizer_json() -> dict[str, Any]:
    """tiny_models.py's tokenizer, its word list run on to the real vocabulary size."""
    doc = tm.tokenizer_json()
    vocab: dict[str, int] = doc["model"]["vocab"]
    for i in range(tm.VOCAB_SIZE, VOCAB_SIZE):
        vocab[f"w{i}"] = i
    return doc


def meta() -> dict[str, Any]:
    return {
        "vocab_size": VOCAB_SIZE,
        "first_word_id": tm.FIRST_WORD_ID,
        "special_ids": dict(tm.IDS),
        "image_token": "<|image|>",
        "max_soft_tokens": 280,
        "text_layer_types": list(TEXT_LAYER_TYPES),
        "head_dim": HEAD_DIM,
        "global_head_dim": GLOBAL_HEAD_DIM,
        "sliding_window": SLIDING_WINDOW,
        "dflash_layer_types": list(DFLASH_LAYER_TYPES),
        "dflash_head_dim": 128,
        "dflash_target_layer_ids": list(DFLASH_TARGET_LAYER_IDS),
        # transformers >= 5.15 pops both from text_config (tiny_models.text_config says why per_layer_config is
        # null); vLLM reads them as attributes, so they go back in as overrides.
        "target_hf_overrides": {"text_config": {"global_head_dim": GLOBAL_HEAD_DIM,
                                                "num_global_key_value_heads": NUM_GLOBAL_KV_HEADS}},
        "mtp": {"available": True, "standin": "mtp-standin", "standin_why": MTP_STANDIN_WHY},
        "sources": dict(SOURCES),
        "published": dict(PUBLISHED),
        "not_published": dict(NOT_PUBLISHED),
        "weights": "none: run with load_format='dummy'",
    }


def _dump(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def write_all(outdir: Path) -> dict[str, Any]:
    target = outdir / "target"
    _dump(target / "config.json", target_config())
    _dump(target / "generation_config.json", tm.generation_config())
    _dump(target / "tokenizer.json", tokenizer_json())
    tok_cfg = tm.tokenizer_config()
    tok_cfg["model_max_length"] = MAX_POS
    _dump(target / "tokenizer_config.json", tok_cfg)
    _dump(target / "special_tokens_map.json", {
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>",
    })
    proc = tm.processor_config()
    proc["image_seq_length"] = 280
    for sub in ("image_processor", "video_processor"):
        proc[sub]["max_soft_tokens"] = 280
    _dump(target / "processor_config.json", proc)
    _dump(outdir / "dflash" / "config.json", dflash_config())
    _dump(outdir / "mtp" / "config.json", mtp_config())
    _dump(outdir / "mtp-standin" / "config.json", mtp_standin_config())
    info = meta()
    _dump(outdir / "meta.json", info)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", type=Path)
    args = ap.parse_args(argv)
    write_all(args.outdir)
    print(f"wrote {args.outdir}: target, dflash, mtp, mtp-standin, meta.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
