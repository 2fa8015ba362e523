"""Train the tiny Gemma 4 target and its DFlash drafter on the GPU machine; write checkpoints vLLM loads by name;
compute the reference acceptance our own implementation says vLLM should reach.

  python tests/gpu/e2e/train_models.py OUTDIR [--target-steps N] [--draft-steps N] [--seed S]

OUTDIR/target   Gemma4ForConditionalGeneration: the 26B-A4B layer pattern (30 layers, 25 sliding of head_dim
                256 + 5 full of 512, in its order), the MoE block on (4 experts, top 2), vision config and
                use_bidirectional_attention "vision"; hidden 128, vocabulary 1024. model.safetensors holds the
                trained text weights and a seeded vision tower (transformers' own module, as vLLM builds it).
OUTDIR/dflash   DFlashDraftModel shaped like the published Gemma 4 drafters: 5 layers [S,S,S,S,F], window 256,
                head_dim 128, block 16, target_layer_ids [1,6,12,17,23,28], mask token 4, fc + hidden_norm.
OUTDIR/train.json  steps, losses, seconds; OUTDIR/reference.json  the reference acceptance (tiny_lang prompts).

The language is tiny_lang's chain language (a dialect named once, beyond the sliding window).
The drafter learns from the frozen target:
its labels are the target's own greedy tokens (teacher-forced), so a perfect drafter would be accepted always.
Deterministic from --seed (torch and the language); on one machine and library set, the same checkpoints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import tiny_lang  # noqa: E402
import tiny_models  # noqa: E402
from tiny_torch import FULL, Drafter, DraftShape, Target, TargetShape, load_checkpoint  # noqa: E402

TS = TargetShape()
DS = DraftShape()
SMOKE = False  # --smoke: tiny batches, to check the code on a CPU


# ---------------------------------------------------------------------------------------------------------------
# Configs (tiny_models.py's files, with the trained geometry)
# ---------------------------------------------------------------------------------------------------------------
def write_configs(out: Path) -> dict[str, Any]:
    tiny_models.write_all(out)
    tcfg = json.loads((out / "target" / "config.json").read_text())
    text = tcfg["text_config"]
    text.update({
        "hidden_size": TS.hidden, "intermediate_size": TS.intermediate, "num_hidden_layers": len(TS.layer_types),
        "layer_types": list(TS.layer_types), "num_attention_heads": TS.heads, "num_key_value_heads": TS.kv_heads,
        "head_dim": TS.head_dim, "global_head_dim": TS.global_head_dim, "sliding_window": TS.window,
        "final_logit_softcapping": TS.softcap, "enable_moe_block": True, "num_experts": TS.num_experts,
        "top_k_experts": TS.top_k, "moe_intermediate_size": TS.moe_intermediate,
    })
    (out / "target" / "config.json").write_text(json.dumps(tcfg, indent=2) + "\n")
    dcfg = json.loads((out / "dflash" / "config.json").read_text())
    dcfg.update({
        "hidden_size": DS.hidden, "target_hidden_size": TS.hidden, "intermediate_size": DS.intermediate,
        "num_hidden_layers": len(DS.layer_types), "layer_types": list(DS.layer_types),
        "max_window_layers": len(DS.layer_types), "sliding_window": DS.window, "use_sliding_window": True,
        "num_attention_heads": DS.heads, "num_key_value_heads": DS.kv_heads, "head_dim": DS.head_dim,
        "block_size": DS.block, "num_target_layers": len(TS.layer_types),
        "dflash_config": {"mask_token_id": DS.mask_id, "target_layer_ids": list(DS.target_layer_ids)},
    })
    (out / "dflash" / "config.json").write_text(json.dumps(dcfg, indent=2) + "\n")
    if (out / "mtp").exists():  # the MTP drafter is not trained here: leave no half-made checkpoint behind
        for f in (out / "mtp").iterdir():
            f.unlink()
        (out / "mtp").rmdir()
    meta = json.loads((out / "meta.json").read_text())
    meta.update({"weights": "trained: train_models.py", "text_layer_types": list(TS.layer_types),
                 "sliding_window": TS.window, "dflash_layer_types": list(DS.layer_types),
                 "dflash_target_layer_ids": list(DS.target_layer_ids), "dflash_window": DS.window,
                 "mtp": {"available": False, "reason": "not trained by train_models.py"}})
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def vision_weights(target_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """A seeded, untrained vision tower under the names vLLM loads (it builds transformers' own module)."""
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(seed)
    cfg = AutoConfig.from_pretrained(target_dir)
    tower = AutoModel.from_config(cfg.vision_config)
    out = {f"model.vision_tower.{k}": v.detach().clone() for k, v in tower.state_dict().items()}
    vh = cfg.vision_config.hidden_size
    out["model.embed_vision.embedding_projection.weight"] = torch.randn(TS.hidden, vh) * vh ** -0.5
    return out


def save(state: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    tmp = path.with_suffix(".tmp")
    save_file({k: v.to(torch.bfloat16).contiguous().cpu() for k, v in state.items()}, str(tmp))
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------
def lr_at(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * 0.5 * (1 + torch.cos(torch.tensor((step - warm) / max(1, steps - warm) * 3.14159265)).item())


def train_target(model: Target, steps: int, seed: int, dev: torch.device, log: list[dict[str, Any]]) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)
    batch, length = (2, 64) if SMOKE else (32, 512)
    t0 = time.time()
    for step in range(steps):
        tok = torch.tensor(tiny_lang.training_batch(seed, step, batch, length), device=dev)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, 1e-3)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits, _ = model(tok[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tok[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            log.append({"step": step, "loss": round(loss.item(), 4), "s": round(time.time() - t0, 1)})
            print(f"target step {step} loss {loss.item():.4f} {time.time() - t0:.0f}s", flush=True)


def target_pass(target: Target, tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(concatenated auxiliary states [B,T,6H], greedy next tokens [B,T]) of the frozen target."""
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=tok.device.type == "cuda"):
        logits, aux = target(tok, DS.target_layer_ids)
    return torch.cat(aux, -1).to(torch.bfloat16), logits.argmax(-1)


def train_drafter(drafter: Drafter, target: Target, steps: int, seed: int, dev: torch.device,
                  log: list[dict[str, Any]]) -> None:
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)
    batch, length, anchors = (2, 96, 4) if SMOKE else (16, 768, 48)
    k = DS.block
    weights = torch.tensor([0.9 ** j for j in range(k - 1)], device=dev)
    embed, head = target.embed_tokens.weight.detach(), target.embed_tokens.weight.detach()
    gen = torch.Generator(device="cpu").manual_seed(seed + 7)
    t0 = time.time()
    for step in range(steps):
        tok = torch.tensor(tiny_lang.training_batch(seed + 1, step, batch, length), device=dev)
        feats, greedy = target_pass(target, tok)
        t = tok.shape[1]
        # anchors p: the context is 0..p, the block predicts the target's greedy tokens at p+2 .. p+K
        anc = torch.randint(16, t - k - 1, (batch, anchors), generator=gen).to(dev)
        bonus = greedy.gather(1, anc)  # the target's token at p+1
        # labels: the target's greedy continuation of its own greedy tokens is not available teacher-forced;
        # its greedy prediction at each true prefix (greedy[q] predicts q+1) stands in for it
        idx = anc[:, :, None] + 1 + torch.arange(1, k, device=dev)  # positions p+2 .. p+K
        labels = greedy.gather(1, (idx - 1).reshape(batch, -1)).view(batch, anchors, k - 1)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, 1e-3)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = drafter(feats, bonus, anc, embed, head, TS.hidden ** 0.5, TS.softcap)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        loss = (ce.view(batch, anchors, k - 1) * weights).sum(-1).mean() / weights.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            acc = (logits.argmax(-1) == labels).float().mean().item()
            log.append({"step": step, "loss": round(loss.item(), 4), "token_acc": round(acc, 4),
                        "s": round(time.time() - t0, 1)})
            print(f"draft step {step} loss {loss.item():.4f} acc {acc:.3f} {time.time() - t0:.0f}s", flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Reference acceptance
# ---------------------------------------------------------------------------------------------------------------
def greedy_continuations(target: Target, prompts: list[list[int]], n: int, dev: torch.device) -> list[list[int]]:
    """The target's greedy continuation of every prompt, n tokens each (batched; right padding cannot change a
    causal model's logits at earlier positions)."""
    seqs = [list(p) for p in prompts]
    width = max(len(p) for p in prompts) + n
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        for _ in range(n):
            tok = torch.zeros((len(seqs), max(len(s) for s in seqs)), dtype=torch.long, device=dev)
            for i, s in enumerate(seqs):
                tok[i, : len(s)] = torch.tensor(s, device=dev)
            logits, _ = target(tok)
            last = torch.tensor([len(s) - 1 for s in seqs], device=dev)
            nxt = logits[torch.arange(len(seqs), device=dev), last].argmax(-1).tolist()
            for s, t in zip(seqs, nxt, strict=True):
                s.append(int(t))
    assert all(len(s) <= width for s in seqs)
    return [s[len(p):] for s, p in zip(seqs, prompts, strict=True)]


def simulate(prompt: list[int], out: list[int], max_tokens: int, drafts: dict[int, list[int]],
             num_spec: int) -> dict[str, Any]:
    """vLLM's greedy speculative loop over a known target continuation (out: at least max_tokens + num_spec
    tokens). drafts[p] are the drafter's tokens for positions p+2.. after context 0..p. As vLLM: the prefill emits
    the first token, every step then verifies a whole draft (drafts reaching past max_tokens are verified and
    counted too: vLLM counted 15 draft tokens for every draft, num_draft_tokens = 15 x num_drafts) and emits the
    accepted tokens and one more, until max_tokens are out."""
    seq = prompt + out
    p = len(prompt) - 1
    emitted = 1
    n_drafts = n_acc = 0
    per_pos = [0] * num_spec
    while emitted < max_tokens:
        d = drafts[p][:num_spec]
        a = 0
        while a < num_spec and d[a] == seq[p + 2 + a]:
            per_pos[a] += 1
            a += 1
        n_drafts += 1
        n_acc += a
        p += a + 1
        emitted += a + 1
    return {"drafts": n_drafts, "accepted": n_acc, "per_pos": per_pos,
            "acceptance_length": 1 + n_acc / n_drafts if n_drafts else None}


def all_drafts(drafter: Drafter, target: Target, seq: list[int], start: int, dev: torch.device,
               **kw: Any) -> dict[int, list[int]]:
    """The drafter's tokens after every anchor p >= start of one sequence (the target's own tokens)."""
    tok = torch.tensor([seq], device=dev)
    feats, _ = target_pass(target, tok)
    anchors = list(range(start, len(seq) - 1))
    out: dict[int, list[int]] = {}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        for i in range(0, len(anchors), 64):
            chunk = anchors[i:i + 64]
            anc = torch.tensor([chunk], device=dev)
            bonus = tok.gather(1, anc + 1)
            kw2 = {"embed_scale": TS.hidden ** 0.5, "softcap": TS.softcap, **kw}
            logits = drafter(feats, bonus, anc, target.embed_tokens.weight, target.embed_tokens.weight, **kw2)
            for j, p in enumerate(chunk):
                out[p] = logits[0, j].argmax(-1).tolist()
    return out


def reference(target: Target, drafter: Drafter, prompts: list[dict[str, Any]], dev: torch.device,
              variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    per: dict[str, dict[str, Any]] = {}
    totals: dict[str, dict[str, int]] = {v: {"drafts": 0, "accepted": 0} for v in variants}
    extra = DS.block  # the continuation runs on past max_tokens, so a last draft reaching past it can be judged
    longest = max(int(pr["max_tokens"]) for pr in prompts) + extra
    outs = greedy_continuations(target, [list(pr["token_ids"]) for pr in prompts], longest, dev)
    for pr, full in zip(prompts, outs, strict=True):
        ids, n = list(pr["token_ids"]), int(pr["max_tokens"])
        seq = ids + full
        row: dict[str, Any] = {"prompt_tokens": len(ids), "output": full[:n]}
        for name, kw in variants.items():
            sim = simulate(ids, full, n, all_drafts(drafter, target, seq, len(ids) - 1, dev, **kw), DS.block - 1)
            row[name] = sim
            totals[name]["drafts"] += sim["drafts"]
            totals[name]["accepted"] += sim["accepted"]
        per[str(pr["id"])] = row
    summary = {name: {**t, "acceptance_length": 1 + t["accepted"] / t["drafts"] if t["drafts"] else None}
               for name, t in totals.items()}
    return {"summary": summary, "requests": per}


REFERENCE_VARIANTS: dict[str, dict[str, Any]] = {
    "series": {},  # what the patched vLLM should do
    "no_embed_scale": {"embed_scale": None},  # patch 0001's scale left out
    "no_softcap": {"softcap": None},  # 0001's soft cap left out: argmax-invariant, greedy drafts unchanged
    "no_window_causality": {"sliding_causal": False, "windowed": False},  # 0005 left out: all layers full
}


def train_both(out: Path, args: argparse.Namespace, dev: torch.device) -> tuple[Target, Drafter]:
    write_configs(out)
    summary: dict[str, Any] = {"seed": args.seed, "device": torch.cuda.get_device_name() if dev.type == "cuda"
                               else "cpu", "torch": torch.__version__, "language": tiny_lang.LANGUAGE,
                               "target_shape": TS.__dict__,
                               "draft_shape": {k: v for k, v in DS.__dict__.items() if k != "options"}}
    target = Target(TS).to(dev)
    summary["target_params"] = sum(p.numel() for p in target.parameters())
    log_t: list[dict[str, Any]] = []
    t0 = time.time()
    train_target(target, args.target_steps, args.seed, dev, log_t)
    summary["target"] = {"steps": args.target_steps, "seconds": round(time.time() - t0, 1), "log": log_t}
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    save({**target.hf_state_dict(), **vision_weights(out / "target", args.seed)}, out / "target" / "model.safetensors")
    drafter = Drafter(DS).to(dev)
    summary["draft_params"] = sum(p.numel() for p in drafter.parameters())
    log_d: list[dict[str, Any]] = []
    t0 = time.time()
    train_drafter(drafter, target, args.draft_steps, args.seed, dev, log_d)
    summary["dflash"] = {"steps": args.draft_steps, "seconds": round(time.time() - t0, 1), "log": log_d}
    drafter.eval()
    save(drafter.hf_state_dict(), out / "dflash" / "model.safetensors")
    (out / "train.json").write_text(json.dumps(summary, indent=1) + "\n")
    return target, drafter


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--target-steps", type=int, default=600)
    ap.add_argument("--draft-steps", type=int, default=900)
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--reference-prompts", type=int, default=48)
    ap.add_argument("--smoke", action="store_true", help="tiny batches: check the code on a CPU")
    ap.add_argument("--reference-only", action="store_true",
                    help="load the checkpoints already in OUTDIR and compute the reference acceptance only")
    args = ap.parse_args(argv)
    global SMOKE
    SMOKE = args.smoke
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    out: Path = args.outdir
    out.mkdir(parents=True, exist_ok=True)
    if args.reference_only:
        target, drafter = Target(TS).to(dev), Drafter(DS).to(dev)
        missing = load_checkpoint(target, str(out / "target" / "model.safetensors"))
        missing += load_checkpoint(drafter, str(out / "dflash" / "model.safetensors"))
        if missing:
            raise SystemExit(f"checkpoints in {out} lack {missing[:5]}...: train first")
        target.eval()
        drafter.eval()
    else:
        target, drafter = train_both(out, args, dev)
    t0 = time.time()
    prompts = tiny_lang.eval_prompts()[: args.reference_prompts]
    ref = reference(target, drafter, prompts, dev, REFERENCE_VARIANTS)
    ref["seconds"] = round(time.time() - t0, 1)
    ref["num_speculative_tokens"] = DS.block - 1
    (out / "reference.json").write_text(json.dumps(ref) + "\n")
    print("reference:", json.dumps(ref["summary"]), flush=True)
    assert FULL in DS.layer_types
    return 0


if __name__ == "__main__":
    sys.exit(main())
