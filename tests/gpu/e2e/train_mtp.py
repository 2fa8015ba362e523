"""Train a Gemma 4 MTP drafter (`gemma4_assistant`) on the frozen trained target (train_models.py) and compute the
acceptance our own implementation says vLLM should reach with it.

  python tests/gpu/e2e/train_mtp.py OUTDIR [--steps N] [--seed S] [--reference-only] [--smoke]

OUTDIR holds the trained target (OUTDIR/target, from train_models.py). Writes OUTDIR/mtp (config.json +
model.safetensors under the names vLLM 0.21.0's Gemma4MTP loads), OUTDIR/train-mtp.json and
OUTDIR/reference-mtp.json, and marks the drafter available in OUTDIR/meta.json.

The drafter as vLLM 0.21.0 runs it (model_executor/models/gemma4_mtp.py, v1/spec_decode/gemma4.py,
llm_base_proposer.py), written here from that reading:
  step 1   after context 0..p and the token x at p+1: input = concat(the target's embedding of x x sqrt(backbone
           hidden) (the proposer shares the target's table), the target's final-normed hidden state at p) ->
           pre_projection -> layers -> norm = the draft state; the draft token for p+2 = argmax of the draft state
           against the drafter's own table (lm_head tied to its embed_tokens); post_projection(draft state) is the
           hidden state fed to the next step.
  step k   the previous draft token and the previous step's post_projection output, at the SAME position p
           (Gemma4Proposer.constant_draft_positions: positions and seq_lens do not advance), -> the token for p+k+1.
  layers   Gemma 4 decoder layers without K/V: the query (q_proj, q_norm with weight, RoPE of the layer kind at
           position p, scale 1.0) attends to the target's cached K/V of its last layer of the same kind
           (kv_sharing_target_layer_name), keys 0..p; sandwich norms, GELU-tanh MLP, x layer_scalar; no MoE.
Training: teacher-forced tokens (the sequence's), hidden states fed back through the unrolled steps, labels the
target's own greedy tokens; deterministic from --seed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import tiny_lang  # noqa: E402
import tiny_models  # noqa: E402
import train_models as tm  # noqa: E402
from tiny_torch import FULL, SLIDING, RMSNorm, Target, attend, causal_mask, inv_freq, load_checkpoint, rope  # noqa: E402

TS = tm.TS


@dataclass(frozen=True)
class MtpShape:
    hidden: int = 128
    intermediate: int = 512
    # Full-attention layers only: under transformers 5.17 a gemma4_text config loses global_head_dim (it moves into
    # a per-layer view), so a sliding layer (head_dim 256) next to a full one (512) could not be described to
    # vLLM 0.21.0's draft config; every layer full, head_dim = the target's full-layer head size.
    layer_types: tuple[str, ...] = (FULL, FULL)
    heads: int = 2
    kv_heads: int = 1  # the target's (the K/V are the target's)
    head_dim: int = 512
    steps: int = 4  # num_speculative_tokens


MS = MtpShape()


class MtpLayer(nn.Module):
    def __init__(self, s: MtpShape, kind: str) -> None:
        super().__init__()
        self.kind = kind
        h, hd = s.hidden, s.head_dim
        self.q_proj = nn.Linear(h, s.heads * hd, bias=False)
        self.o_proj = nn.Linear(s.heads * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, hd ** -0.25)
        post = (2 * len(s.layer_types)) ** -0.5
        self.input_layernorm = RMSNorm(h)
        self.post_attention_layernorm = RMSNorm(h, post)
        self.pre_feedforward_layernorm = RMSNorm(h)
        self.post_feedforward_layernorm = RMSNorm(h, post)
        self.gate_proj = nn.Linear(h, s.intermediate, bias=False)
        self.up_proj = nn.Linear(h, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, h, bias=False)
        self.register_buffer("layer_scalar", torch.ones(1))
        if kind == SLIDING:
            self.register_buffer("freqs", inv_freq(TS.head_dim, TS.sliding_theta), persistent=False)
        else:
            self.register_buffer("freqs", inv_freq(hd, TS.full_theta, TS.full_partial, True), persistent=False)


class Mtp(nn.Module):
    def __init__(self, s: MtpShape) -> None:
        super().__init__()
        self.s = s
        self.embed_tokens = nn.Embedding(TS.vocab, s.hidden)  # the lm_head (tied); inputs use the target's table
        nn.init.normal_(self.embed_tokens.weight, std=s.hidden ** -0.5)
        self.pre_projection = nn.Linear(2 * TS.hidden, s.hidden, bias=False)
        self.post_projection = nn.Linear(s.hidden, TS.hidden, bias=False)
        self.layers = nn.ModuleList(MtpLayer(s, kind) for kind in s.layer_types)
        self.norm = RMSNorm(s.hidden)

    def forward(self, emb: torch.Tensor, hid: torch.Tensor, pos: torch.Tensor,
                kv: dict[str, tuple[torch.Tensor, torch.Tensor]], masks: dict[str, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(draft logits [B,Tq,V] float32, the hidden state for the next step [B,Tq,backbone]); emb/hid [B,Tq,*]
        at query positions pos [Tq]; kv[kind] = the target's (k, v) [B,KV,Tk,D]; masks[kind] [1,1,Tq,Tk]."""
        s = self.s
        b, t, _ = emb.shape
        x = self.pre_projection(torch.cat([emb, hid], -1))
        for L in self.layers:
            r = x
            y = L.input_layernorm(x)
            q = L.q_norm(L.q_proj(y).view(b, t, s.heads, -1)).transpose(1, 2)
            q = rope(q, pos, L.freqs)
            k, v = kv[L.kind]
            a = attend(q, k, v, masks[L.kind], 1.0).transpose(1, 2).reshape(b, t, -1)
            x = L.post_attention_layernorm(L.o_proj(a)) + r
            r = x
            y = L.pre_feedforward_layernorm(x)
            y = L.down_proj(F.gelu(L.gate_proj(y), approximate="tanh") * L.up_proj(y))
            x = (L.post_feedforward_layernorm(y) + r) * L.layer_scalar
        d = self.norm(x)
        return F.linear(d, self.embed_tokens.weight).float(), self.post_projection(d)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.hf_tensors().items()}

    def hf_tensors(self) -> dict[str, torch.Tensor]:
        """gemma4_assistant checkpoint names (gemma4_mtp.py's layout)."""
        out = {"model.embed_tokens.weight": self.embed_tokens.weight, "model.norm.weight": self.norm.weight,
               "pre_projection.weight": self.pre_projection.weight,
               "post_projection.weight": self.post_projection.weight}
        for i, L in enumerate(self.layers):
            q = f"model.layers.{i}."
            out[q + "self_attn.q_proj.weight"] = L.q_proj.weight
            out[q + "self_attn.o_proj.weight"] = L.o_proj.weight
            out[q + "self_attn.q_norm.weight"] = L.q_norm.weight
            for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                         "post_feedforward_layernorm"):
                out[f"{q}{name}.weight"] = getattr(L, name).weight
            for name in ("gate_proj", "up_proj", "down_proj"):
                out[f"{q}mlp.{name}.weight"] = getattr(L, name).weight
            out[q + "layer_scalar"] = L.layer_scalar
        return out


def shared_layers() -> dict[str, int]:
    """The target layer each drafter layer kind reads K/V from: its last layer of that kind (no KV-shared target
    layers: num_kv_shared_layers 0), as Gemma4Proposer._setup_gemma4_kv_sharing wires it."""
    return {kind: max(i for i, k in enumerate(TS.layer_types) if k == kind) for kind in (SLIDING, FULL)}


def target_state(target: Target, tok: torch.Tensor) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, ...]],
                                                              torch.Tensor]:
    """The frozen target over tok [B,T]: (final-normed hidden states [B,T,H], the K/V each drafter layer kind
    shares, greedy next tokens [B,T])."""
    shared = shared_layers()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=tok.device.type == "cuda"):
        logits, _, kv, normed = target.states(tok, kv_ids=tuple(shared.values()))
    return normed, {kind: kv[i] for kind, i in shared.items()}, logits.argmax(-1)


def masks_for(tq: int, tk: int, dev: torch.device) -> dict[str, torch.Tensor]:
    """Query i sits at position i and sees keys 0..i (sliding: the last TS.window of them): the target's own
    causal masks, first tq rows."""
    return {SLIDING: causal_mask(tk, TS.window, dev)[:, :, :tq], FULL: causal_mask(tk, None, dev)[:, :, :tq]}


def train(mtp: Mtp, target: Target, steps: int, seed: int, dev: torch.device, smoke: bool,
          log: list[dict[str, Any]]) -> None:
    opt = torch.optim.AdamW(mtp.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)
    batch, length = (2, 48) if smoke else (16, 512)
    n = MS.steps
    scale = torch.tensor(TS.hidden ** 0.5)
    t0 = time.time()
    for step in range(steps):
        tok = torch.tensor(tiny_lang.training_batch(seed + 2, step, batch, length), device=dev)
        normed, kv, greedy = target_state(target, tok)
        tq = tok.shape[1] - n  # anchors p = 0 .. T-1-n: every step's input and label exist
        pos = torch.arange(tq, device=dev)
        masks = masks_for(tq, tok.shape[1], dev)
        for g in opt.param_groups:
            g["lr"] = tm.lr_at(step, steps, 1e-3)
        hid = normed[:, :tq]
        losses, accs = [], []
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            for k in range(1, n + 1):
                emb = target.embed_tokens(tok[:, k:k + tq]).detach() * scale.to(normed.dtype)
                logits, hid = mtp(emb, hid, pos, kv, masks)
                labels = greedy[:, k:k + tq]  # the target's token for p+k+1 at the true prefix 0..p+k
                losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)))
                accs.append((logits.argmax(-1) == labels).float().mean())
        loss = torch.stack(losses).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(mtp.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            acc = [round(a.item(), 4) for a in accs]
            log.append({"step": step, "loss": round(loss.item(), 4), "token_acc_per_step": acc,
                        "s": round(time.time() - t0, 1)})
            print(f"mtp step {step} loss {loss.item():.4f} acc {acc} {time.time() - t0:.0f}s", flush=True)


def all_drafts(mtp: Mtp, target: Target, seq: list[int], start: int, dev: torch.device) -> dict[int, list[int]]:
    """The drafter's tokens after every anchor p >= start of one sequence, as vLLM's loop makes them: step 1 from
    the sequence's token at p+1, later steps from the previous draft token, all at position p."""
    tok = torch.tensor([seq], device=dev)
    normed, kv, _ = target_state(target, tok)
    t = len(seq) - 1  # anchors 0 .. T-2 (the token at p+1 exists)
    pos = torch.arange(t, device=dev)
    masks = masks_for(t, len(seq), dev)
    scale = torch.tensor(TS.hidden ** 0.5)
    drafts = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        ids, hid = tok[:, 1:], normed[:, :t]
        for _ in range(MS.steps):
            emb = target.embed_tokens(ids) * scale.to(normed.dtype)
            logits, hid = mtp(emb, hid, pos, kv, masks)
            ids = logits.argmax(-1)
            drafts.append(ids[0])
    d = torch.stack(drafts, -1).tolist()
    return {p: d[p] for p in range(start, t)}


def reference(target: Target, mtp: Mtp, prompts: list[dict[str, Any]], dev: torch.device) -> dict[str, Any]:
    longest = max(int(pr["max_tokens"]) for pr in prompts) + MS.steps + 1
    outs = tm.greedy_continuations(target, [list(pr["token_ids"]) for pr in prompts], longest, dev)
    per: dict[str, Any] = {}
    drafts_n = acc_n = 0
    for pr, full in zip(prompts, outs, strict=True):
        ids, n = list(pr["token_ids"]), int(pr["max_tokens"])
        sim = tm.simulate(ids, full, n, all_drafts(mtp, target, ids + full, len(ids) - 1, dev), MS.steps)
        per[str(pr["id"])] = {"prompt_tokens": len(ids), "output": full[:n], "mtp": sim}
        drafts_n += sim["drafts"]
        acc_n += sim["accepted"]
    summary = {"mtp": {"drafts": drafts_n, "accepted": acc_n,
                       "acceptance_length": 1 + acc_n / drafts_n if drafts_n else None}}
    return {"summary": summary, "requests": per, "num_speculative_tokens": MS.steps}


def write_config(out: Path) -> None:
    cfg = tiny_models.mtp_config()
    text = cfg["text_config"]
    text.update({
        "vocab_size": TS.vocab, "hidden_size": MS.hidden, "intermediate_size": MS.intermediate,
        "num_hidden_layers": len(MS.layer_types), "num_kv_shared_layers": len(MS.layer_types),
        "layer_types": list(MS.layer_types), "num_attention_heads": MS.heads, "num_key_value_heads": MS.kv_heads,
        "head_dim": MS.head_dim, "global_head_dim": MS.head_dim, "sliding_window": TS.window,
        "final_logit_softcapping": TS.softcap,
    })
    cfg["backbone_hidden_size"] = TS.hidden
    (out / "mtp").mkdir(parents=True, exist_ok=True)
    (out / "mtp" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    meta = json.loads((out / "meta.json").read_text())
    meta["mtp"] = {"available": True, "weights": "trained: train_mtp.py", "layer_types": list(MS.layer_types),
                   "num_speculative_tokens": MS.steps, "kv_shared_with": shared_layers()}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--reference-prompts", type=int, default=48)
    ap.add_argument("--smoke", action="store_true", help="tiny batches: check the code on a CPU")
    ap.add_argument("--reference-only", action="store_true", help="load OUTDIR/mtp and compute the reference only")
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed + 3)
    torch.backends.cuda.matmul.allow_tf32 = False
    out: Path = args.outdir
    target = Target(TS).to(dev)
    missing = load_checkpoint(target, str(out / "target" / "model.safetensors"))
    if missing:
        raise SystemExit(f"{out}/target lacks {missing[:5]}...: run train_models.py first")
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    mtp = Mtp(MS).to(dev)
    if args.reference_only:
        missing = load_checkpoint(mtp, str(out / "mtp" / "model.safetensors"))  # type: ignore[arg-type]
        if missing:
            raise SystemExit(f"{out}/mtp lacks {missing[:5]}...: train first")
    else:
        log: list[dict[str, Any]] = []
        t0 = time.time()
        train(mtp, target, args.steps, args.seed, dev, args.smoke, log)
        summary = {"seed": args.seed, "steps": args.steps, "seconds": round(time.time() - t0, 1), "log": log,
                   "shape": MS.__dict__, "params": sum(p.numel() for p in mtp.parameters()),
                   "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__}
        write_config(out)
        tm.save(mtp.hf_state_dict(), out / "mtp" / "model.safetensors")
        (out / "train-mtp.json").write_text(json.dumps(summary, indent=1) + "\n")
    mtp.eval()
    t0 = time.time()
    ref = reference(target, mtp, tiny_lang.eval_prompts()[: args.reference_prompts], dev)
    ref["seconds"] = round(time.time() - t0, 1)
    (out / "reference-mtp.json").write_text(json.dumps(ref) + "\n")
    print("reference:", json.dumps(ref["summary"]), flush=True)
    assert math.isfinite(ref["summary"]["mtp"]["acceptance_length"] or 0.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
