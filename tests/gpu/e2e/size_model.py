"""Parameters and KV cache of a Gemma 4 target and its drafters, counted from their config.json dicts alone.

Pure Python (no torch, no transformers), so the memory rule and the reports can use it anywhere. What is counted
is what a checkpoint holds: every weight of transformers' Gemma4ForConditionalGeneration / Gemma4AssistantForCausalLM
and vLLM's qwen3_dflash, plus the per-layer ``layer_scalar`` (and the vision tower's standardisation vectors) that
transformers keeps as buffers but the checkpoints store. tests/unit/gpu_scripts/test_real_size.py holds the count to
transformers' own modules instantiated on the meta device and to the published figures.

Active parameters per token are all of them but the experts a token's router does not pick: (E - k) / E of every
MoE block. The embedding counts as active: it is the tied LM head, read whole for every token's logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class Count:
    total: int
    active: int
    parts: dict[str, int]


def _full_geometry(tc: dict[str, Any]) -> tuple[int, int]:
    """(KV heads, head dim) of a full-attention layer: Gemma 4's wider global heads, shared K/V heads with k_eq_v."""
    head_dim = int(tc.get("global_head_dim") or tc["head_dim"])
    kv = int(tc["num_key_value_heads"])
    if tc.get("attention_k_eq_v") and tc.get("num_global_key_value_heads"):
        kv = int(tc["num_global_key_value_heads"])
    return kv, head_dim


def _attention(tc: dict[str, Any], kind: str, hidden: int, kv_shared: bool) -> int:
    heads = int(tc["num_attention_heads"])
    if kind == FULL:
        kv, hd = _full_geometry(tc)
        separate_v = not tc.get("attention_k_eq_v")
    else:
        kv, hd = int(tc["num_key_value_heads"]), int(tc["head_dim"])
        separate_v = True
    q_and_o = 2 * hidden * heads * hd + hd  # q_proj, o_proj, q_norm
    if kv_shared:  # reads another layer's K/V: no k/v projections, no k_norm
        return q_and_o
    return q_and_o + hidden * kv * hd * (2 if separate_v else 1) + hd  # k_proj (+ v_proj), k_norm


def text_params(tc: dict[str, Any]) -> Count:
    """A gemma4_text model: embedding (tied head), layers, final norm."""
    hidden, layers = int(tc["hidden_size"]), list(tc["layer_types"])
    if len(layers) != int(tc["num_hidden_layers"]):
        raise ValueError(f"layer_types has {len(layers)} entries, num_hidden_layers is {tc['num_hidden_layers']}")
    if int(tc.get("hidden_size_per_layer_input") or 0):
        raise ValueError("per-layer embeddings (hidden_size_per_layer_input > 0) are not counted here")
    first_shared = len(layers) - int(tc.get("num_kv_shared_layers") or 0)
    attn = sum(_attention(tc, kind, hidden, i >= first_shared) for i, kind in enumerate(layers))
    dense = len(layers) * 3 * hidden * int(tc["intermediate_size"])
    norms = len(layers) * (4 * hidden + 1)  # input, post-attention, pre- and post-feedforward; layer_scalar
    experts = router = 0
    if tc.get("enable_moe_block"):
        n_exp, width = int(tc["num_experts"]), int(tc["moe_intermediate_size"])
        experts = len(layers) * n_exp * 3 * hidden * width  # gate_up_proj + down_proj per expert
        router = len(layers) * (n_exp * hidden + hidden + n_exp)  # proj, scale, per_expert_scale
        norms += len(layers) * 3 * hidden  # the MoE branch's own pre/post norms
    embed = int(tc["vocab_size"]) * hidden
    parts = {"embedding": embed, "attention": attn, "dense_mlp": dense, "experts": experts, "router": router,
             "norms": norms + hidden}
    total = sum(parts.values())
    idle = 0
    if experts:
        idle = experts * (int(tc["num_experts"]) - int(tc["top_k_experts"])) // int(tc["num_experts"])
    return Count(total=total, active=total - idle, parts=parts)


def vllm_extra_params(tc: dict[str, Any]) -> int:
    """Weights vLLM 0.21.0 holds beyond the checkpoint: its fused qkv_proj keeps a V slot on k_eq_v full layers and
    loads K's weights into it (gemma4.py Gemma4Attention), one KV-width projection per such layer."""
    if not tc.get("attention_k_eq_v"):
        return 0
    kv, hd = _full_geometry(tc)
    return sum(int(tc["hidden_size"]) * kv * hd for kind in tc["layer_types"] if kind == FULL)


def vision_params(vc: dict[str, Any], text_hidden: int) -> Count:
    """A gemma4_vision tower with its patch embedder and the projection into the text model's width."""
    h, layers = int(vc["hidden_size"]), int(vc["num_hidden_layers"])
    heads, kv, hd = int(vc["num_attention_heads"]), int(vc["num_key_value_heads"]), int(vc["head_dim"])
    per_layer = (2 * h * heads * hd + 2 * h * kv * hd + 2 * hd  # q, o, k, v; q_norm, k_norm
                 + 3 * h * int(vc["intermediate_size"]) + 4 * h)
    patch = int(vc["patch_size"])
    parts = {
        "layers": layers * per_layer,
        "patch_embedder": 3 * patch * patch * h + 2 * int(vc["position_embedding_size"]) * h,
        "standardize": 2 * h if vc.get("standardize") else 0,
        "projection": h * text_hidden,
    }
    total = sum(parts.values())
    return Count(total=total, active=total, parts=parts)


def target_params(cfg: dict[str, Any]) -> dict[str, Count]:
    text = text_params(cfg["text_config"])
    out = {"text": text}
    if cfg.get("vision_config"):
        out["vision"] = vision_params(cfg["vision_config"], int(cfg["text_config"]["hidden_size"]))
    return out


def dflash_params(dc: dict[str, Any]) -> Count:
    """vLLM's qwen3_dflash drafter as its checkpoint holds it: qwen3 layers (q/k norms), the fc + hidden_norm bridge
    from the target's hidden states, a final norm. No embedding and no LM head: the published drafters ship
    neither and vLLM's proposer shares the target's (so they cost no memory of their own either)."""
    h, n = int(dc["hidden_size"]), int(dc["num_hidden_layers"])
    heads, kv, hd = int(dc["num_attention_heads"]), int(dc["num_key_value_heads"]), int(dc["head_dim"])
    per_layer = 2 * h * heads * hd + 2 * h * kv * hd + 2 * hd + 3 * h * int(dc["intermediate_size"]) + 2 * h
    n_taps = len(dc["dflash_config"]["target_layer_ids"])
    target_h = int(dc.get("target_hidden_size") or h)
    parts = {"layers": n * per_layer, "fc": n_taps * target_h * h, "norms": 2 * h}  # hidden_norm, final norm
    total = sum(parts.values())
    return Count(total=total, active=total, parts=parts)


def mtp_params(mc: dict[str, Any]) -> Count:
    """A gemma4_assistant drafter: its text model (every layer KV-shared), pre/post projections to the target's
    width, the tied head; the centroid head only with use_ordered_embeddings."""
    tc = mc["text_config"]
    text = text_params(tc)
    h, back = int(tc["hidden_size"]), int(mc["backbone_hidden_size"])
    parts = dict(text.parts)
    parts["projections"] = 2 * back * h + h * back
    if mc.get("use_ordered_embeddings"):
        parts["centroids"] = h * int(mc["num_centroids"])
    total = sum(parts.values())
    return Count(total=total, active=total, parts=parts)


# ---------------------------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KvLayer:
    kind: str
    kv_heads: int
    head_dim: int
    window: int | None  # tokens a sliding layer keeps; None: every token


def kv_layers(tc: dict[str, Any]) -> list[KvLayer]:
    """The layers that hold a KV cache of their own (KV-shared layers hold none). K and V are both stored, also on
    k_eq_v layers: vLLM loads K's weights into the V slot and caches both."""
    layers = list(tc["layer_types"])
    first_shared = len(layers) - int(tc.get("num_kv_shared_layers") or 0)
    out = []
    for kind in layers[:first_shared]:
        if kind == FULL:
            kv, hd = _full_geometry(tc)
            out.append(KvLayer(FULL, kv, hd, None))
        elif kind == SLIDING:
            out.append(KvLayer(SLIDING, int(tc["num_key_value_heads"]), int(tc["head_dim"]),
                               int(tc["sliding_window"])))
        else:
            raise ValueError(f"layer type {kind!r}: expected {SLIDING} or {FULL}")
    return out


def kv_cache_bytes(layers: list[KvLayer], context_tokens: int, dtype_bytes: int = 2) -> int:
    """KV bytes one sequence of context_tokens holds: sliding layers at most their window, full layers all of it.
    (vLLM allocates in blocks and keeps window - 1 + the step's new tokens on sliding layers: the memory rule
    calibrates against what vLLM reports; this is the model it calibrates.)"""
    if context_tokens < 0:
        raise ValueError(f"context_tokens {context_tokens}: expected >= 0")
    total = 0
    for layer in layers:
        kept = context_tokens if layer.window is None else min(context_tokens, layer.window)
        total += 2 * layer.kv_heads * layer.head_dim * dtype_bytes * kept
    return total


def kv_bytes_per_token(layers: list[KvLayer], context_tokens: int, dtype_bytes: int = 2) -> float:
    """Average KV bytes per token of a sequence of context_tokens (falls as sliding layers stop growing)."""
    if context_tokens <= 0:
        raise ValueError(f"context_tokens {context_tokens}: expected > 0")
    return kv_cache_bytes(layers, context_tokens, dtype_bytes) / context_tokens
