"""Our own PyTorch Gemma 4 text target and DFlash drafter: for training, and as the reference that says what vLLM's
acceptance should be (train_models.py).

Written from the published architecture as vLLM 0.21.0 runs it (model_executor/models/gemma4.py,
qwen3_dflash.py patched by dflash-batched-verification, v1/spec_decode/dflash.py), so that weights trained here
mean the same in vLLM. What must agree, and where vLLM says so:
  target  embeddings x sqrt(hidden); per layer input_layernorm -> attention (q/k RMSNorm with weight, v RMSNorm
          without, neox RoPE: sliding layers default theta 1e4 over head_dim, full layers "proportional" theta 1e6
          over a quarter of head_dim with the frequencies' denominator the whole head_dim, scale 1.0, a window of W
          keys q-W < k <= q on sliding layers) -> post_attention_layernorm + residual -> pre_feedforward_layernorm ->
          GELU-tanh MLP (+ the MoE branch: router on the residual through a weightless RMSNorm, x hidden**-0.5,
          x scale; softmax over all experts, top-k, renormalised, x per_expert_scale; experts on
          pre_feedforward_layernorm_2(residual); post_feedforward_layernorm_1/_2; their sum) ->
          post_feedforward_layernorm + residual -> x layer_scalar; final norm; tied LM head; logits soft-capped.
          Auxiliary hidden state k = the residual stream after k layers (0 = the scaled embeddings).
  drafter context = fc(concat of the target's auxiliary states) -> hidden_norm -> each layer's k/v projection, k
          RMSNorm, RoPE at the context positions; the block = [bonus token, mask x (B-1)] at positions p+1..p+B,
          embedded with the target's table x sqrt(hidden) (patch 0001); Qwen3 layers (scale head_dim**-0.5); full
          layers non-causal over context <= p and the whole block, sliding layers causal with their window (patch
          0005); final norm; the target's LM head; the draft for position p+1+j is the argmax at block offset j.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

SLIDING = "sliding_attention"
FULL = "full_attention"


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    y = y.to(x.dtype)
    return y * weight if weight is not None else y


class RMSNorm(nn.Module):
    def __init__(self, dim: int, init: float = 1.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x, self.weight)


def inv_freq(head_dim: int, theta: float, partial: float = 1.0, proportional: bool = False) -> torch.Tensor:
    if proportional:
        angles = int(head_dim * partial) // 2
        f = 1.0 / (theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.float) / head_dim))
        return torch.cat([f, torch.zeros(head_dim // 2 - angles)])
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def rope(x: torch.Tensor, pos: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """neox-style RoPE; x [..., T, D], pos [T] (or broadcastable [..., T])."""
    ang = pos.float()[..., None] * freqs.to(x.device)[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B,H,Tq,D], k/v [B,KV,Tk,D], mask [B or 1, 1, Tq, Tk] bool (True: attend)."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


# ---------------------------------------------------------------------------------------------------------------
# The target
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TargetShape:
    vocab: int = 1024
    hidden: int = 128
    intermediate: int = 256
    layer_types: tuple[str, ...] = tuple(([SLIDING] * 5 + [FULL]) * 5)  # 26B-A4B: 25 sliding + 5 full
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 256
    global_head_dim: int = 512
    window: int = 64
    softcap: float = 30.0
    num_experts: int = 4
    top_k: int = 2
    moe_intermediate: int = 64
    sliding_theta: float = 10000.0
    full_theta: float = 1000000.0
    full_partial: float = 0.25


class TargetLayer(nn.Module):
    def __init__(self, s: TargetShape, kind: str) -> None:
        super().__init__()
        self.kind = kind
        hd = s.head_dim if kind == SLIDING else s.global_head_dim
        self.hd, self.s = hd, s
        h = s.hidden
        self.q_proj = nn.Linear(h, s.heads * hd, bias=False)
        self.k_proj = nn.Linear(h, s.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, s.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(s.heads * hd, h, bias=False)
        # q/k norm weights start at hd**-0.25: with attention scale 1.0, scores of std ~1 at the start
        self.q_norm = RMSNorm(hd, hd ** -0.25)
        self.k_norm = RMSNorm(hd, hd ** -0.25)
        # The sandwich norms' output weights start small: at 1, each of the 30 layers adds two unit-RMS random
        # branches to the residual stream and buries the token's own embedding (training stalled at the
        # unigram loss); small, the stream starts as the embedding (as residual branches initialised near zero).
        post = (2 * len(s.layer_types)) ** -0.5
        self.input_layernorm = RMSNorm(h)
        self.post_attention_layernorm = RMSNorm(h, post)
        self.pre_feedforward_layernorm = RMSNorm(h)
        self.post_feedforward_layernorm = RMSNorm(h, post)
        self.gate_proj = nn.Linear(h, s.intermediate, bias=False)
        self.up_proj = nn.Linear(h, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, h, bias=False)
        e, mi = s.num_experts, s.moe_intermediate
        self.router_proj = nn.Linear(h, e, bias=False)
        self.router_scale = nn.Parameter(torch.ones(h))
        self.per_expert_scale = nn.Parameter(torch.ones(e))
        self.experts_gate_up = nn.Parameter(torch.randn(e, 2 * mi, h) * h ** -0.5)
        self.experts_down = nn.Parameter(torch.randn(e, h, mi) * mi ** -0.5)
        self.post_feedforward_layernorm_1 = RMSNorm(h)
        self.pre_feedforward_layernorm_2 = RMSNorm(h)
        self.post_feedforward_layernorm_2 = RMSNorm(h)
        self.register_buffer("layer_scalar", torch.ones(1))
        if kind == SLIDING:
            self.register_buffer("freqs", inv_freq(hd, s.sliding_theta), persistent=False)
        else:
            self.register_buffer("freqs", inv_freq(hd, s.full_theta, s.full_partial, True), persistent=False)

    def moe(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        s = self.s
        r = rms(residual, None) * (s.hidden ** -0.5) * self.router_scale
        logits = self.router_proj(r).float()
        probs = logits.softmax(-1)
        top_w, top_i = probs.topk(s.top_k, dim=-1)
        top_w = top_w / top_w.sum(-1, keepdim=True)
        top_w = top_w * self.per_expert_scale[top_i].float()
        weights = torch.zeros_like(probs).scatter(-1, top_i, top_w).to(x.dtype)  # [..., E]
        gu = torch.einsum("...h,eih->...ei", x, self.experts_gate_up)
        mi = s.moe_intermediate
        act = F.gelu(gu[..., :mi], approximate="tanh") * gu[..., mi:]
        out = torch.einsum("...ei,ehi->...eh", act, self.experts_down)
        return (out * weights[..., None]).sum(-2)

    def forward(self, h: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                kv_out: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """The layer; kv_out, when given, receives the (k, v) it attends with: what vLLM caches for it."""
        s, hd = self.s, self.hd
        b, t, _ = h.shape
        x = self.input_layernorm(h)
        q = self.q_norm(self.q_proj(x).view(b, t, s.heads, hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, s.kv_heads, hd)).transpose(1, 2)
        v = rms(self.v_proj(x).view(b, t, s.kv_heads, hd), None).transpose(1, 2)
        q, k = rope(q, pos, self.freqs), rope(k, pos, self.freqs)
        if kv_out is not None:
            kv_out.append((k, v))
        a = attend(q, k, v, mask, 1.0).transpose(1, 2).reshape(b, t, s.heads * hd)
        h = self.post_attention_layernorm(self.o_proj(a)) + h
        residual = h
        x = self.pre_feedforward_layernorm(h)
        m = self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))
        m = self.post_feedforward_layernorm_1(m) + self.post_feedforward_layernorm_2(
            self.moe(self.pre_feedforward_layernorm_2(residual), residual))
        h = self.post_feedforward_layernorm(m) + residual
        return h * self.layer_scalar


def causal_mask(t: int, window: int | None, device: torch.device) -> torch.Tensor:
    i = torch.arange(t, device=device)
    m = i[None, :] <= i[:, None]
    if window is not None:
        m = m & (i[:, None] - i[None, :] < window)
    return m[None, None]


class Target(nn.Module):
    def __init__(self, s: TargetShape) -> None:
        super().__init__()
        self.s = s
        self.embed_tokens = nn.Embedding(s.vocab, s.hidden)
        nn.init.normal_(self.embed_tokens.weight, std=s.hidden ** -0.5)
        self.layers = nn.ModuleList(TargetLayer(s, kind) for kind in s.layer_types)
        self.norm = RMSNorm(s.hidden)
        for layer in self.layers:
            for lin in (layer.q_proj, layer.k_proj, layer.v_proj, layer.gate_proj, layer.up_proj, layer.router_proj):
                nn.init.normal_(lin.weight, std=s.hidden ** -0.5)
            for lin in (layer.o_proj, layer.down_proj):
                nn.init.normal_(lin.weight, std=lin.weight.shape[1] ** -0.5 / math.sqrt(2 * len(s.layer_types)))

    def forward(self, tokens: torch.Tensor, aux_ids: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Soft-capped logits [B,T,V] (float32) and the auxiliary states named by aux_ids."""
        logits, aux, _, _ = self.states(tokens, aux_ids)
        return logits, aux

    def states(self, tokens: torch.Tensor, aux_ids: tuple[int, ...] = (), kv_ids: tuple[int, ...] = ()) -> tuple[
            torch.Tensor, list[torch.Tensor], dict[int, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """forward's logits and auxiliary states, the (k, v) of the layers named by kv_ids (what an MTP drafter
        shares) and the final-normed hidden states [B,T,H] (what vLLM hands an MTP drafter)."""
        s = self.s
        t = tokens.shape[1]
        pos = torch.arange(t, device=tokens.device)
        h = self.embed_tokens(tokens) * torch.tensor(s.hidden ** 0.5, dtype=self.embed_tokens.weight.dtype)
        masks = {SLIDING: causal_mask(t, s.window, tokens.device), FULL: causal_mask(t, None, tokens.device)}
        aux = [h] if 0 in aux_ids else []
        kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, layer in enumerate(self.layers):
            got: list[tuple[torch.Tensor, torch.Tensor]] = []
            h = layer(h, pos, masks[layer.kind], got if i in kv_ids else None)
            if got:
                kv[i] = got[0]
            if i + 1 in aux_ids:
                aux.append(h)
        normed = self.norm(h)
        logits = F.linear(normed, self.embed_tokens.weight).float()
        return torch.tanh(logits / s.softcap) * s.softcap, aux, kv, normed

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Checkpoint names of Gemma4ForConditionalGeneration (what vLLM's loader maps), text part only."""
        return {k: v.detach() for k, v in self.hf_tensors().items()}

    def hf_tensors(self) -> dict[str, torch.Tensor]:
        p = "model.language_model."
        out = {p + "embed_tokens.weight": self.embed_tokens.weight, p + "norm.weight": self.norm.weight}
        for i, L in enumerate(self.layers):
            q = f"{p}layers.{i}."
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[f"{q}self_attn.{name}.weight"] = getattr(L, name).weight
            out[f"{q}self_attn.q_norm.weight"] = L.q_norm.weight
            out[f"{q}self_attn.k_norm.weight"] = L.k_norm.weight
            for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                         "post_feedforward_layernorm", "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
                         "post_feedforward_layernorm_2"):
                out[f"{q}{name}.weight"] = getattr(L, name).weight
            for name in ("gate_proj", "up_proj", "down_proj"):
                out[f"{q}mlp.{name}.weight"] = getattr(L, name).weight
            out[f"{q}router.proj.weight"] = L.router_proj.weight
            out[f"{q}router.scale"] = L.router_scale
            out[f"{q}router.per_expert_scale"] = L.per_expert_scale
            out[f"{q}experts.gate_up_proj"] = L.experts_gate_up
            out[f"{q}experts.down_proj"] = L.experts_down
            out[f"{q}layer_scalar"] = L.layer_scalar
        return out


# ---------------------------------------------------------------------------------------------------------------
# The DFlash drafter
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftShape:
    hidden: int = 128
    intermediate: int = 256
    layer_types: tuple[str, ...] = (SLIDING, SLIDING, SLIDING, SLIDING, FULL)  # the published Gemma 4 drafters
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 128
    window: int = 256
    block: int = 16
    mask_id: int = 4
    target_layer_ids: tuple[int, ...] = (1, 6, 12, 17, 23, 28)  # as [1,12,23,35,46,57] over 60 layers
    theta: float = 1000000.0
    # what vLLM applies and a left-out patch would not (the ablations' reference uses these too)
    options: dict[str, bool] = field(default_factory=dict, compare=False)


class DraftLayer(nn.Module):
    def __init__(self, s: DraftShape, kind: str) -> None:
        super().__init__()
        self.kind = kind
        h, hd = s.hidden, s.head_dim
        self.q_proj = nn.Linear(h, s.heads * hd, bias=False)
        self.k_proj = nn.Linear(h, s.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, s.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(s.heads * hd, h, bias=False)
        self.q_norm = RMSNorm(hd)
        self.k_norm = RMSNorm(hd)
        self.input_layernorm = RMSNorm(h)
        self.post_attention_layernorm = RMSNorm(h)
        self.gate_proj = nn.Linear(h, s.intermediate, bias=False)
        self.up_proj = nn.Linear(h, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, h, bias=False)


class Drafter(nn.Module):
    def __init__(self, s: DraftShape) -> None:
        super().__init__()
        self.s = s
        self.fc = nn.Linear(s.hidden * len(s.target_layer_ids), s.hidden, bias=False)
        self.hidden_norm = RMSNorm(s.hidden)
        self.layers = nn.ModuleList(DraftLayer(s, kind) for kind in s.layer_types)
        self.norm = RMSNorm(s.hidden)
        self.register_buffer("freqs", inv_freq(s.head_dim, s.theta), persistent=False)

    def block_masks(self, anchors: torch.Tensor, t_ctx: int, sliding_causal: bool = True,
                    windowed: bool = True) -> dict[str, torch.Tensor]:
        """Masks [B,1,A*K, T+A*K] for anchors [B,A] (p: the last context position of each block)."""
        s = self.s
        k = s.block
        b, a = anchors.shape[0], anchors.shape[1]
        dev = anchors.device
        qpos = (anchors[:, :, None] + 1 + torch.arange(k, device=dev)).reshape(b, a * k)  # [B, A*K]
        cpos = torch.arange(t_ctx, device=dev)
        qa = torch.arange(a, device=dev).repeat_interleave(k)  # anchor of each query row
        qj = torch.arange(k, device=dev).repeat(a)
        ctx_ok = cpos[None, None, :] <= anchors.repeat_interleave(k, 1)[:, :, None]  # [B, AK, T]
        same = (qa[:, None] == qa[None, :])[None]  # [1, AK, AK]
        full = torch.cat([ctx_ok, same.expand(b, -1, -1)], -1)
        causal_blk = same & (qj[None, :] <= qj[:, None])[None]
        slide_ctx = ctx_ok
        if windowed:
            slide_ctx = slide_ctx & (qpos[:, :, None] - cpos[None, None, :] < s.window)
        blk = causal_blk if sliding_causal else same
        slide = torch.cat([slide_ctx, blk.expand(b, -1, -1)], -1)
        return {FULL: full[:, None], SLIDING: slide[:, None]}

    def forward(self, feats: torch.Tensor, bonus: torch.Tensor, anchors: torch.Tensor, embed: torch.Tensor,
                lm_head: torch.Tensor, embed_scale: float | None, softcap: float | None,
                sliding_causal: bool = True, windowed: bool = True) -> torch.Tensor:
        """Draft logits [B, A, K-1, V] for blocks after anchors [B,A] (bonus [B,A]: the token at p+1)."""
        s = self.s
        b, t, _ = feats.shape
        a, k = anchors.shape[1], s.block
        dev = feats.device
        ctx = self.hidden_norm(self.fc(feats.to(self.fc.weight.dtype)))  # [B,T,H]
        cpos = torch.arange(t, device=dev)
        qpos = (anchors[:, :, None] + 1 + torch.arange(k, device=dev)).reshape(b, a * k)
        ids = torch.full((b, a, k), s.mask_id, dtype=torch.long, device=dev)
        ids[:, :, 0] = bonus
        h = F.embedding(ids.reshape(b, a * k), embed)
        if embed_scale is not None:
            h = h * torch.tensor(embed_scale, dtype=h.dtype)
        masks = self.block_masks(anchors, t, sliding_causal, windowed)
        hd, scale = s.head_dim, s.head_dim ** -0.5
        for L in self.layers:
            x = L.input_layernorm(h)
            q = L.q_norm(L.q_proj(x).view(b, a * k, s.heads, hd)).transpose(1, 2)
            kb = L.k_norm(L.k_proj(x).view(b, a * k, s.kv_heads, hd)).transpose(1, 2)
            vb = L.v_proj(x).view(b, a * k, s.kv_heads, hd).transpose(1, 2)
            kc = L.k_norm(L.k_proj(ctx).view(b, t, s.kv_heads, hd)).transpose(1, 2)
            vc = L.v_proj(ctx).view(b, t, s.kv_heads, hd).transpose(1, 2)
            q, kb = rope(q, qpos[:, None], self.freqs), rope(kb, qpos[:, None], self.freqs)
            kc = rope(kc, cpos, self.freqs)
            o = attend(q, torch.cat([kc, kb], 2), torch.cat([vc, vb], 2), masks[L.kind], scale)
            h = h + L.o_proj(o.transpose(1, 2).reshape(b, a * k, s.heads * hd))
            x = L.post_attention_layernorm(h)
            h = h + L.down_proj(F.silu(L.gate_proj(x)) * L.up_proj(x))
        logits = F.linear(self.norm(h), lm_head).float().view(b, a, k, -1)[:, :, 1:]
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        return logits

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """z-lab DFlash checkpoint names (qwen3_dflash.py load_weights adds "model."); no embed_tokens and no
        lm_head: vLLM shares the target's (llm_base_proposer _maybe_share_embeddings / _maybe_share_lm_head)."""
        return {k: v.detach() for k, v in self.hf_tensors().items()}

    def hf_tensors(self) -> dict[str, torch.Tensor]:
        out = {"fc.weight": self.fc.weight, "hidden_norm.weight": self.hidden_norm.weight,
               "norm.weight": self.norm.weight}
        for i, L in enumerate(self.layers):
            q = f"layers.{i}."
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[f"{q}self_attn.{name}.weight"] = getattr(L, name).weight
            out[f"{q}self_attn.q_norm.weight"] = L.q_norm.weight
            out[f"{q}self_attn.k_norm.weight"] = L.k_norm.weight
            out[f"{q}input_layernorm.weight"] = L.input_layernorm.weight
            out[f"{q}post_attention_layernorm.weight"] = L.post_attention_layernorm.weight
            for name in ("gate_proj", "up_proj", "down_proj"):
                out[f"{q}mlp.{name}.weight"] = getattr(L, name).weight
        return out


def load_checkpoint(module: Target | Drafter, path: str) -> list[str]:
    """Copy a checkpoint written from hf_state_dict() back into the module; returns the names it lacked."""
    from safetensors.torch import load_file

    state = load_file(path)
    missing = []
    with torch.no_grad():
        for name, t in module.hf_tensors().items():
            if name in state:
                t.copy_(state[name].to(t.dtype))
            else:
                missing.append(name)
    return missing
