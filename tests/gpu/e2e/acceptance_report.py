"""Fold the acceptance runs (acceptance_runs.py) and the reference (train_models.py) into one result file.

  python acceptance_report.py --out tests/gpu/results/vllm-0.21.0-acceptance.json \
      --train train.json --reference reference.json --run LABEL=PATH [--run LABEL=PATH ...] [--superseded LABEL=PATH]

LABEL names what the run is in the result (e.g. dflash, target, dflash-strict, mtp, mtp-strict, target-mtp,
target-mtp-strict (the target alone of the MTP runs' machine), speed-target, speed-dflash, speed-mtp,
ablation-no-embed-scale); the report reads whichever phases each run holds. --serve LABEL=PATH adds a
serve_route.py result; --pristine PATH [--pristine-log LOG] the pristine wheel's DFlash + flash_attn start
(engine_runs.py, run_e2e.sh step pristine). Judgements:
  matches_reference  |vLLM acceptance length - reference| <= ACCEPTANCE_TOLERANCE x reference, for the series
                     (default and strict numerics: dflash, dflash-strict, mtp, mtp-strict) and for every
                     ablation the reference models (no_embed_scale, no_softcap, no_window_causality)
  greedy_equal       every request's tokens equal between the target alone and DFlash, in a pair of runs
  prefix_same        every prefix-cache hit drafts and accepts as its cold run (counts) and emits the same tokens
                     (null where no second run read anything from the cache: nothing to judge)
  prefix_cache_hits  with the drafter, every prompt the target alone read back from the prefix cache on its second
                     run (by id; without the target's run, every prompt but the shortest) read back too
  pristine_refuses_flash_attn  the registry wheel as published stops DFlash with a flash_attn drafter beside a
                     Gemma 4 target, naming FLASH_ATTN as not valid (the users' error, in the pin's own words)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

# The reference runs our PyTorch model in bf16 autocast, vLLM its own kernels (Triton attention for the target,
# FlashAttention for the drafter, fused MoE): argmaxes at near-ties can part and move a draft's accepted length.
# 2% of the acceptance length is ~0.3 token at 15 and ~0.03 at 1.3: small against what an ablation moves it by.
ACCEPTANCE_TOLERANCE = 0.02

ABLATIONS = {  # run label -> reference variant
    "ablation-no-embed-scale": "no_embed_scale",
    "ablation-no-softcap": "no_softcap",
    "ablation-no-window": "no_window_causality",
}


def load(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def outputs(run: dict[str, Any]) -> dict[str, list[int]]:
    main = run.get("main") or {}
    return {o["id"]: o["token_ids"] for o in main.get("outputs", []) + main.get("image_outputs", [])}


def compare(a: dict[str, list[int]], b: dict[str, list[int]]) -> dict[str, Any]:
    ids = sorted(set(a) & set(b))
    differ = []
    for k in ids:
        if a[k] != b[k]:
            pairs_ = enumerate(zip(a[k], b[k], strict=False))
            first = next((i for i, (x, y) in pairs_ if x != y), min(len(a[k]), len(b[k])))
            differ.append({"id": k, "first_difference": first})
    return {"requests": len(ids), "equal": len(ids) - len(differ), "tokens": sum(len(a[k]) for k in ids),
            "differ": differ, "greedy_equal": bool(ids) and not differ and set(a) == set(b)}


def prefix_rows(run: dict[str, Any], target: dict[str, Any] | None) -> dict[str, Any]:
    rows = (run.get("prefix") or {}).get("rows", [])
    tgt = {(r["id"], r["run"]): r["token_ids"] for r in ((target or {}).get("prefix") or {}).get("rows", [])}
    pairs = []
    for cold, hit in zip(rows[0::2], rows[1::2], strict=True):
        assert cold["id"] == hit["id"] and cold["run"] == "cold" and hit["run"] == "hit"
        cs, hs = cold["spec"], hit["spec"]
        pairs.append({
            "id": cold["id"], "prompt_tokens": cold["prompt_len"], "cached_tokens_on_hit": hit["num_cached_tokens"],
            "cold": {k: cs[k] for k in ("num_drafts", "num_accepted_tokens", "acceptance_length")},
            "hit": {k: hs[k] for k in ("num_drafts", "num_accepted_tokens", "acceptance_length")},
            "same_tokens": cold["token_ids"] == hit["token_ids"],
            "equal_to_target": (tgt.get((cold["id"], "cold")) == cold["token_ids"]) if tgt else None,
        })
    same = all(p["same_tokens"] and p["cold"] == p["hit"] for p in pairs)
    with_hit = sum(1 for p in pairs if (p["cached_tokens_on_hit"] or 0) > 0)
    target_hits = {r["id"]: r["num_cached_tokens"] for r in ((target or {}).get("prefix") or {}).get("rows", [])
                   if r.get("run") == "hit"}
    # the prompts that must hit: those the target alone read back (by id); without its run, all but the shortest,
    # which may fit no full block
    expected = [p for p in pairs if target_hits.get(p["id"])] if target_hits else pairs[1:]
    hits = len(pairs) >= 2 and bool(expected) and all((p["cached_tokens_on_hit"] or 0) > 0 for p in expected)
    # a second run that read nothing from the cache is a cold run again: its sameness says nothing of caching
    # (null), its difference still is one (false)
    return {"pairs": pairs, "prefix_same": (bool(pairs) and same) if with_hit or not same else None,
            "pairs_with_a_hit": with_hit, "every_longer_prompt_hit_the_cache": hits,
            "target_alone_cached_tokens_on_hit": [target_hits[p["id"]] for p in pairs if p["id"] in target_hits]
            or None}


def context_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    by: dict[int, list[dict[str, Any]]] = {}
    for r in (run.get("context") or {}).get("rows", []):
        by.setdefault(int(r["context"]), []).append(r["spec"])
    out = []
    for n in sorted(by):
        d = sum(s["num_drafts"] for s in by[n])
        a = sum(s["num_accepted_tokens"] for s in by[n])
        out.append({"context_tokens": n, "requests": len(by[n]), "drafts": d,
                    "acceptance_length": round(1 + a / d, 4) if d else None})
    return out


def speed(target: dict[str, Any], drafters: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Tokens/s of each drafter's run against the target alone's, per concurrency (runs of one call)."""
    t = target.get("speed") or {}
    rows: dict[str, Any] = {}
    for conc in ("1", "8", "22"):
        if conc not in t:
            continue
        row: dict[str, Any] = {"target_tokens_per_s": t[conc]["tokens_per_s"], "requests": t[conc]["requests"],
                               "max_tokens": t.get("max_tokens")}
        for name, run in drafters.items():
            d = (run.get("speed") or {}).get(conc)
            if d:
                row[f"{name}_tokens_per_s"] = d["tokens_per_s"]
                row[f"{name}_ratio"] = round(d["tokens_per_s"] / t[conc]["tokens_per_s"], 2)
                row[f"{name}_acceptance_length"] = d["spec"]["acceptance_length"]
        rows[conc] = row
    device = next((r.get("device") for r in drafters.values() if r.get("device")), target.get("device"))
    return {"by_concurrency": rows, "device": device, "same_machine_side_by_side": True}


def summary_of(run: dict[str, Any]) -> dict[str, Any]:
    main = run.get("main") or {}
    out: dict[str, Any] = {"ok": run.get("ok"), "dtype": run.get("dtype"), "numerics": run.get("numerics"),
                           "engine_start_s": run.get("engine_start_s"), "ablation": run.get("ablation")}
    resolved = run.get("resolved") or {}
    for key in ("attention_backend", "spec_attention_backend"):
        if resolved.get(key):
            out[key] = resolved[key]
    if (run.get("env") or {}).get("VLLM_FLASH_ATTN_VERSION"):
        out["flash_attn_version"] = run["env"]["VLLM_FLASH_ATTN_VERSION"]
    versions = run.get("versions") or {}
    if versions:
        out["versions"] = {k: versions[k] for k in ("vllm", "torch", "transformers") if k in versions}
    if (run.get("engine_kwargs") or {}).get("gpu_memory_utilization") is not None:
        out["gpu_memory_utilization"] = run["engine_kwargs"]["gpu_memory_utilization"]
    runner = [ln for ln in run.get("backends") or [] if "Model Runner" in ln]
    if runner:
        out["model_runner"] = runner[0].split("Using ")[-1]
    if main:
        out["text_acceptance_length"] = main["text_spec"]["acceptance_length"]
        out["text_drafts"] = main["text_spec"]["num_drafts"]
        out["text_per_position_accepted"] = main["text_spec"]["per_pos"]
        out["image_acceptance_length"] = main["image_spec"]["acceptance_length"]
    if not run.get("ok"):
        out["error"] = (run.get("error") or "").split("\n")[0][:400]
    return out


def serve_summary(run: dict[str, Any]) -> dict[str, Any]:
    """What serve_route.py found: the rendered script, its start, the requests, the acceptance from /metrics."""
    out = {k: run.get(k) for k in ("ok", "recipe", "drafter", "render", "script", "start_s", "served_model",
                                   "summary", "metrics_spec", "launch_script_notes", "exit_code")}
    # the trained models' folder as MODELS (serve_route.py names it so; a result kept before it did, by shape)
    out["render"] = [re.sub(r"/[^\s=]*/trained(?=/|$)", "MODELS", c) for c in out["render"] or []]
    if not run.get("ok"):
        out["error"] = run.get("error")
    return out


def build(train: dict[str, Any], ref: dict[str, Any], runs: dict[str, dict[str, Any]],
          superseded: dict[str, dict[str, Any]], train_mtp: dict[str, Any] | None = None,
          ref_mtp: dict[str, Any] | None = None, serve: dict[str, dict[str, Any]] | None = None,
          pin: str = "vllm-0.21.0") -> dict[str, Any]:
    rs = ref["summary"]
    training = {k: train.get(k) for k in ("seed", "device", "torch", "language", "target_params", "draft_params",
                                          "target_shape", "draft_shape")}
    tlast, dlast = train["target"]["log"][-1], train["dflash"]["log"][-1]
    training["target"] = {"steps": train["target"]["steps"], "seconds": train["target"]["seconds"],
                          "final_loss": tlast["loss"]}
    training["dflash"] = {"steps": train["dflash"]["steps"], "seconds": train["dflash"]["seconds"],
                          "final_loss": dlast["loss"], "final_token_acc": dlast["token_acc"]}
    if train_mtp:
        mlast = train_mtp["log"][-1]
        training["mtp"] = {"steps": train_mtp["steps"], "seconds": train_mtp["seconds"], "final_loss": mlast["loss"],
                           "final_token_acc_per_step": mlast["token_acc_per_step"], "shape": train_mtp.get("shape"),
                           "params": train_mtp.get("params")}
    reference = {k: {kk: v[kk] for kk in ("drafts", "accepted", "acceptance_length")} for k, v in rs.items()}
    if ref_mtp:
        reference["mtp"] = {kk: ref_mtp["summary"]["mtp"][kk] for kk in ("drafts", "accepted", "acceptance_length")}
    res: dict[str, Any] = {
        "pin": pin, "num_speculative_tokens": ref.get("num_speculative_tokens"),
        "num_speculative_tokens_mtp": (ref_mtp or {}).get("num_speculative_tokens"),
        "training": training,
        "reference": reference,
        "acceptance_tolerance": ACCEPTANCE_TOLERANCE,
        "runs": {label: summary_of(r) for label, r in runs.items()},
    }
    checks: dict[str, Any] = {}

    def against(label: str, variant: str) -> None:
        if label not in runs or not runs[label].get("ok") or variant not in reference:
            return
        got = runs[label]["main"]["text_spec"]["acceptance_length"]
        want = reference[variant]["acceptance_length"]
        checks[f"{label}_matches_reference"] = {"vllm": got, "reference": round(want, 4),
                                                "ok": abs(got - want) <= ACCEPTANCE_TOLERANCE * want}

    against("dflash", "series")
    against("mtp", "mtp")
    # the strict numerics (fp16, batch-invariant, eager) too: in the overlaid wheel's runs they accepted exactly
    # what the default ones did (15.947 and 5.0), so a built wheel judged on its strict runs alone is judged
    against("dflash-strict", "series")
    against("mtp-strict", "mtp")
    for label, variant in ABLATIONS.items():
        against(label, variant)
    for drafter, tag in (("dflash", ""), ("mtp", "-mtp")):
        for strict in ("", "-strict"):
            # the target alone of the same machine and call series: target-mtp[-strict] where the MTP runs came
            # later than the DFlash ones, else target[-strict]
            tgt = runs.get(f"target{tag}{strict}") or runs.get(f"target{strict}")
            if tgt is not None and f"{drafter}{strict}" in runs:
                checks[f"greedy{tag}{strict or '-default'}"] = compare(outputs(tgt),
                                                                       outputs(runs[f"{drafter}{strict}"]))
            if f"{drafter}{strict}" in runs and (runs[f"{drafter}{strict}"].get("prefix") or {}).get("rows"):
                pc = res[f"prefix_cache{tag}{strict or '-default'}"] = prefix_rows(runs[f"{drafter}{strict}"], tgt)
                if not strict:
                    checks[f"prefix_cache_hits{tag}"] = {
                        "ok": pc["every_longer_prompt_hit_the_cache"], "pairs_with_a_hit": pc["pairs_with_a_hit"],
                        "pairs": len(pc["pairs"]), "target_alone_cached_tokens_on_hit": pc[
                            "target_alone_cached_tokens_on_hit"]}
        if drafter in runs:
            res[f"acceptance_by_context{tag}"] = context_rows(runs[drafter])
    drafters = {d: runs[f"speed-{d}"] for d in ("dflash", "mtp") if f"speed-{d}" in runs}
    if "speed-target" in runs and drafters:
        res["speed"] = speed(runs["speed-target"], drafters)
    if "speed-earlier-target" in runs and "speed-earlier-dflash" in runs:  # an earlier machine's pair, kept
        res["speed_earlier"] = speed(runs["speed-earlier-target"], {"dflash": runs["speed-earlier-dflash"]})
    if serve:
        res["serve_route"] = {label: serve_summary(r) for label, r in serve.items()}
        checks["serve_route"] = {"ok": all(r.get("ok") for r in serve.values()), "runs": sorted(serve)}
    res["checks"] = checks
    res["superseded"] = {label: summary_of(r) for label, r in superseded.items()}
    return res


REFUSAL = "is not valid for this configuration"


def pristine_summary(run: dict[str, Any], log_text: str = "") -> dict[str, Any]:
    """What the pristine wheel did with DFlash + flash_attn: its refusal line, if any, from the log or the error."""
    text = "\n".join([log_text, str(run.get("error") or "")])
    refusal = next((ln[ln.index("ValueError:"):].strip() for ln in text.splitlines()
                    if REFUSAL in ln and "ValueError:" in ln), None)
    kw = run.get("engine_kwargs") or {}
    return {"ok": bool(run.get("ok")), "stage": run.get("stage"), "refusal": refusal,
            "target_attention_backend": kw.get("attention_backend"),
            "drafter_attention_backend": (kw.get("speculative_config") or {}).get("attention_backend"),
            "versions": {k: v for k, v in (run.get("versions") or {}).items() if k != "vllm_path"}}


def pairs(items: list[str]) -> dict[str, dict[str, Any]]:
    out = {}
    for it in items:
        label, _, path = it.partition("=")
        if not path:
            raise SystemExit(f"--run {it!r}: expected LABEL=PATH")
        out[label] = load(path)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pin", default="vllm-0.21.0", help="the pin whose wheel the runs used")
    ap.add_argument("--train", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--train-mtp", help="train-mtp.json of train_mtp.py")
    ap.add_argument("--reference-mtp", help="reference-mtp.json of train_mtp.py")
    ap.add_argument("--run", action="append", default=[])
    ap.add_argument("--serve", action="append", default=[], help="LABEL=PATH: a serve_route.py result")
    ap.add_argument("--superseded", action="append", default=[], help="LABEL=PATH: kept with the reason, not judged")
    ap.add_argument("--note", action="append", default=[], help="a line for the result's notes")
    ap.add_argument("--overlay", help="overlay.json of the prepare step: the overlaid wheel's version")
    ap.add_argument("--series", action="append", default=[], help="NAME=VERSION of a series the wheel carried")
    ap.add_argument("--pristine", help="the pristine wheel's DFlash + flash_attn run (engine_runs.py JSON)")
    ap.add_argument("--pristine-log", help="its engine log (the refusal's full line)")
    args = ap.parse_args(argv)
    res = build(load(args.train), load(args.reference), pairs(args.run), pairs(args.superseded),
                load(args.train_mtp) if args.train_mtp else None,
                load(args.reference_mtp) if args.reference_mtp else None, pairs(args.serve), args.pin)
    if args.overlay:
        res["wheel"] = {"version": load(args.overlay)["version"],
                        "series": {k: int(v) for k, _, v in (x.partition("=") for x in args.series)},
                        "how": "the registry wheel (sha256 = the pin's) overlaid on the GPU machine by `g4build "
                               "overlay` from the checkout, `g4build validate` ok"}
    if args.pristine:
        log_text = Path(args.pristine_log).read_text(errors="replace") if args.pristine_log else ""
        res["pristine"] = pristine_summary(load(args.pristine), log_text)
        res["checks"]["pristine_refuses_flash_attn"] = {
            "ok": not res["pristine"]["ok"] and bool(res["pristine"]["refusal"]), "refusal": res["pristine"]["refusal"]}
    res["notes"] = args.note
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1) + "\n")
    tmp.replace(args.out)
    print(json.dumps(res["checks"], indent=1)[:3000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
