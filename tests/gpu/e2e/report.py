"""Fold the e2e runs (JSON files written by engine_runs.py, mm_prefix_kernel.py and run_e2e.sh's prepare step)
into the results kept in the repo: tests/gpu/results/vllm-0.21.0-e2e.json and vllm-0.21.0-mm-prefix-kernel.json.

  python tests/gpu/e2e/report.py --runs STAGE/runs --out tests/gpu/results

Runs on the GPU machine right after the runs (it reads the device there), or later anywhere from a copy of the
runs folder (the device block then comes from the runs themselves).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# The restriction users hit on 0.21.0 (vllm/v1/attention/backend.py): the pristine failure must name it.
RESTRICTION_WORDS = ("partial multimodal", "non-causal", "mm_prefix", "mm prefix")


def load(runs: Path, name: str) -> dict[str, Any] | None:
    path = runs / f"{name}.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        return {"ok": False, "error": f"{path.name} is not JSON: {exc}"}
    return doc if isinstance(doc, dict) else {"ok": False, "error": f"{path.name} holds no object"}


def device_info(runs: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The GPU the runs recorded (engine_runs.py and mm_prefix_kernel.py each write theirs)."""
    for run in runs:
        if run and isinstance(run.get("device"), dict) and run["device"].get("name"):
            return dict(run["device"])
    return {}


def outputs_of(run: dict[str, Any] | None) -> dict[str, list[int]]:
    """Per-request output token ids, keyed by request id, from a run's `outputs`."""
    if not run:
        return {}
    outs = run.get("outputs") or []
    result: dict[str, list[int]] = {}
    if isinstance(outs, dict):
        return {str(k): list(v) for k, v in outs.items()}
    for i, item in enumerate(outs):
        if isinstance(item, dict):
            key = str(item.get("id", item.get("request", i)))
            result[key] = list(item.get("token_ids", []))
        else:
            result[str(i)] = list(item)
    return result


def compare(reference: dict[str, list[int]], other: dict[str, list[int]]) -> dict[str, Any]:
    """Greedy speculative decoding is lossless: every request's tokens must equal the reference's."""
    mismatches = []
    for key, ref in reference.items():
        got = other.get(key)
        if got != ref:
            seq = got or []
            first = next((i for i, (a, b) in enumerate(zip(ref, seq, strict=False)) if a != b), min(len(ref), len(seq)))
            mismatches.append({"request": key, "first_difference_at": first,
                               "reference_len": len(ref), "len": len(got or [])})
    equal = bool(reference) and not mismatches and set(other) == set(reference)
    return {"greedy_equal": equal, "compared": len(reference), "mismatches": mismatches[:10]}


def divergence(reference: dict[str, Any] | None, other: dict[str, Any] | None) -> dict[str, Any] | None:
    """Where a speculative run first leaves the reference, request by request, with the reference's top-2
    logprob gap there (a gap near 0 is a tie that rounding can flip; a large gap is not rounding)."""
    if not reference or not other or not reference.get("ok") or not other.get("ok"):
        return None
    ref = {o["id"]: o for o in reference.get("outputs", [])}
    got = {o["id"]: o for o in other.get("outputs", [])}
    firsts: dict[str, int | None] = {}
    gaps: dict[str, float | None] = {}
    same = total = 0
    for key, item in ref.items():
        a, b = item["token_ids"], (got.get(key) or {}).get("token_ids", [])
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        firsts[key] = first
        gap = item.get("top2_gap") or []
        gaps[key] = gap[first] if first is not None and first < len(gap) else None
        same += len(a) if first is None else first
        total += len(a)
    there = [g for g in gaps.values() if g is not None]
    all_gaps = [g for item in ref.values() for g in (item.get("top2_gap") or []) if g is not None]
    return {
        "equal_requests": sum(1 for v in firsts.values() if v is None),
        "requests": len(firsts),
        "tokens_before_first_difference": same,
        "tokens": total,
        # the reference's greedy tokens whose top two logprobs are exactly equal: where any rounding decides
        "reference_exact_ties": sum(1 for g in all_gaps if g == 0.0) if all_gaps else None,
        "largest_top2_gap_at_a_difference": max(there) if there else None,
        "first_difference": firsts,
        "reference_top2_gap_there": gaps,
    }


def summarize_run(run: dict[str, Any] | None) -> dict[str, Any]:
    if run is None:
        return {"ok": False, "error": "not run"}
    keep = ("ok", "error", "requests", "image_requests", "batches", "cuda_graphs", "non_capture_batch_sizes",
            "chunked_prefill", "prefix_caching", "max_num_batched_tokens", "tokens_per_s", "output_tokens",
            "generate_s", "engine_start_s", "acceptance_length", "spec_decode", "backends", "num_speculative_tokens",
            "reason")
    return {k: run[k] for k in keep if k in run}


def pin_wheel_name(pin: str = "vllm-0.21.0") -> str | None:
    try:
        import yaml

        pins = yaml.safe_load((Path(__file__).resolve().parents[3] / "patches" / "pins.yaml").read_text())
        return str(pins["pins"][pin]["wheels"]["manylinux_x86_64"]["file"])
    except (ImportError, OSError, KeyError, TypeError):
        return None


# Result-name suffixes of the engine runs (run_e2e.sh): dtype and numerics. "-bi" runs are under vLLM's
# VLLM_BATCH_INVARIANT=1, where greedy speculative decoding must be bit-exact; without it, the target's kernels
# differ between one-token decode and the k+1-token verification window, and near-ties may flip.
VARIANTS = {
    "": ("bfloat16", "default"),
    "-float16": ("float16", "default"),
    "-bi": ("bfloat16", "batch-invariant"),
    "-float16-bi": ("float16", "batch-invariant"),
    "-bi-casts": ("bfloat16", "batch-invariant-casts"),
    "-bi-eager": ("bfloat16", "batch-invariant-eager"),
    "-float16-bi-casts": ("float16", "batch-invariant-casts"),
    "-float16-bi-eager": ("float16", "batch-invariant-eager"),
}
# Which variant judges `patched.greedy_equal`: the first that ran, in this order. A difference is a defect by
# construction only where the target computes each token exactly as it does alone: batch-invariant kernels and
# op-by-op rounding that does not depend on the graph's outputs (the eager compile backend; Inductor's
# emulate_precision_casts comes close), and then only away from exact ties of the top two logits, which the
# 16-bit logits make common: float16's 10 mantissa bits tie ~9x less often than bfloat16's 7 (5 vs 45 of 1758
# greedy tokens in the recorded runs). The other variants are kept beside it for comparison, not judged.
JUDGED = ("-float16-bi-eager", "-bi-eager", "-float16-bi-casts", "-bi-casts", "-bi", "")


def variant_key(suffix: str) -> str:
    dtype, numerics = VARIANTS[suffix]
    return dtype if numerics == "default" else f"{dtype}-{numerics}"


def lossless(baseline: dict[str, Any] | None, run: dict[str, Any] | None) -> dict[str, Any]:
    """One speculative run against its baseline: ok, greedy_equal and where it first differs."""
    if run is None:
        return {"ok": False, "reason": "not run"}
    if not run.get("ok"):
        return {"ok": False, "reason": run.get("reason") or str(run.get("error") or "failed")[:2000]}
    if not baseline or not baseline.get("ok"):
        return {"ok": True, "greedy_equal": False, "reason": "no baseline run to compare with"}
    return {"ok": True, **compare(outputs_of(baseline), outputs_of(run))}


def build(runs: Path, notes: tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, Any] | None]:
    pristine = load(runs, "pristine-dflash")
    kernel = load(runs, "kernel")
    overlay = load(runs, "overlay")
    validate = load(runs, "validate")
    engine = {f"{mode}{suffix}": load(runs, f"{mode}{suffix}")
              for suffix in VARIANTS for mode in ("baseline", "dflash", "mtp")}
    # The lossless claim is judged where it can be judged bit for bit: under batch-invariant numerics when those
    # runs exist, else under the default numerics (then rounding at near-ties can also make a difference).
    primary = next(sfx for sfx in JUDGED if sfx == "" or (engine[f"baseline{sfx}"] and engine[f"dflash{sfx}"]))
    baseline, dflash, mtp = (engine[f"{m}{primary}"] for m in ("baseline", "dflash", "mtp"))

    pristine_error = (pristine or {}).get("error") or ""
    dflash_cmp = lossless(baseline, dflash)
    mtp_doc: dict[str, Any]
    if mtp is not None and mtp.get("ok"):
        mtp_doc = {**summarize_run(mtp), **lossless(baseline, mtp)}
    else:
        mtp_doc = lossless(baseline, mtp)

    patched = {
        **summarize_run(dflash),
        "ok": bool(dflash and dflash.get("ok")),
        "greedy_equal": bool(dflash_cmp.get("greedy_equal")),
        **{k: v for k, v in dflash_cmp.items() if k not in ("ok", "greedy_equal")},
        "numerics": VARIANTS[primary][1],
        "dtype": VARIANTS[primary][0],
    }
    doc: dict[str, Any] = {
        "what": "Gemma 4 (tiny, dummy weights) + DFlash drafter, attention_backend flash_attn, on the registry "
                "vLLM 0.21.0 wheel: pristine vs overlaid by g4build",
        "script": "tests/gpu/e2e/run_e2e.sh",
        "device": device_info([baseline, dflash, pristine, kernel, *engine.values()]),
        "wheel": {
            "pristine": pin_wheel_name(),
            "overlaid": Path(str((overlay or {}).get("wheel", ""))).name or None,
            "changed_files": len((overlay or {}).get("changed", [])),
            "added_files": len((overlay or {}).get("added", [])),
            "validate_ok": (validate or {}).get("ok"),
        },
        "pristine": {
            "ok": bool(pristine and pristine.get("ok")),
            "error": pristine_error[-3000:],
            "error_names_restriction": any(w in pristine_error.lower() for w in RESTRICTION_WORDS),
            "error_line": next((ln.split(") ", 1)[-1].strip() for ln in pristine_error.splitlines()
                                if any(w in ln.lower() for w in RESTRICTION_WORDS)), None),
        },
        "baseline": summarize_run(baseline),
        "patched": patched,
        "mtp": mtp_doc,
        # every dtype/numerics variant that ran: each drafter against the target alone, same variant
        "lossless": {
            variant_key(suffix): {mode: lossless(engine[f"baseline{suffix}"], engine[f"{mode}{suffix}"])
                                  for mode in ("dflash", "mtp")}
            for suffix in VARIANTS if engine[f"baseline{suffix}"] is not None
        },
        "divergence": {
            variant_key(suffix): {mode: divergence(engine[f"baseline{suffix}"], engine[f"{mode}{suffix}"])
                                  for mode in ("dflash", "mtp")}
            for suffix in VARIANTS if engine[f"baseline{suffix}"] is not None
        },
        "notes": list(notes),
        "tokens_per_s": {
            name: run.get("tokens_per_s") for name, run in engine.items() if run and run.get("ok")
        },
        "acceptance_length": {
            name: run.get("acceptance_length")
            for name, run in engine.items() if run and run.get("ok") and not name.startswith("baseline")
        },
    }
    # earlier runs kept beside the current ones (e.g. dflash-before-fix.json): their divergence too
    known = set(engine)
    for extra in sorted(runs.glob("*-*.json")):
        mode, _, tag = extra.stem.partition("-")
        if mode in ("dflash", "mtp") and tag and extra.stem not in known:
            doc["divergence"].setdefault("bfloat16", {})[extra.stem] = divergence(engine["baseline"],
                                                                                 load(runs, extra.stem))
    # the two drafters against each other: where both leave the target at the same tokens, the cause is shared
    for suffix in VARIANTS:
        if engine[f"dflash{suffix}"] and engine[f"mtp{suffix}"]:
            doc["divergence"].setdefault(variant_key(suffix), {})["dflash_vs_mtp"] = divergence(
                engine[f"dflash{suffix}"], engine[f"mtp{suffix}"])
    # every engine run in the folder, with what it measured (earlier runs kept beside the current ones too)
    doc["runs"] = {
        path.stem: {k: run.get(k) for k in ("mode", "dtype", "numerics", "ok", "engine_start_s", "generate_s",
                                             "output_tokens", "tokens_per_s", "acceptance_length")}
        for path in sorted(runs.glob("*.json"))
        if (run := load(runs, path.stem)) is not None and run.get("mode") in ("baseline", "dflash", "mtp")
    }
    return doc, kernel


def carry_earlier(doc: dict[str, Any], previous: dict[str, Any] | None, label: str | None) -> None:
    """Keep what earlier sessions measured: their `earlier` entries, and with a label the previous result's own
    comparison figures under that label (the runs themselves stay on the machine that made them)."""
    earlier: dict[str, Any] = dict((previous or {}).get("earlier") or {})
    if previous and label:
        earlier[label] = {k: previous.get(k) for k in ("device", "divergence", "runs", "acceptance_length")}
        earlier[label]["greedy_equal"] = (previous.get("patched") or {}).get("greedy_equal")
    if earlier:
        doc["earlier"] = earlier


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", default="vllm-0.21.0")
    ap.add_argument("--note", action="append", default=[], help="a line for the result's notes (repeatable)")
    ap.add_argument("--earlier-label", default=None,
                    help="keep the result being replaced under earlier[LABEL] (its figures, not its runs)")
    args = ap.parse_args(argv)
    doc, kernel = build(args.runs, tuple(args.note))
    args.out.mkdir(parents=True, exist_ok=True)
    previous_path = args.out / f"{args.name}-e2e.json"
    try:
        previous = json.loads(previous_path.read_text()) if previous_path.is_file() else None
    except json.JSONDecodeError:
        previous = None
    carry_earlier(doc, previous if isinstance(previous, dict) else None, args.earlier_label)
    text = json.dumps(doc, indent=1) + "\n"
    # the runs name files under the device's stage folder; keep no machine paths in the repo
    for path in sorted(args.runs.glob("*.json")):
        log = (load(args.runs, path.stem) or {}).get("log")
        if log:
            stage = str(Path(log).parent.parent)
            if len(stage) > 1:
                text = text.replace(stage + "/", "<stage>/")
    (args.out / f"{args.name}-e2e.json").write_text(text)
    if kernel is not None:
        setup = kernel.get("setup")
        if isinstance(setup, dict) and "vllm_file" in setup:
            setup["vllm_file"] = Path(str(setup["vllm_file"])).name  # no machine paths in the repo
        (args.out / f"{args.name}-mm-prefix-kernel.json").write_text(json.dumps(kernel, indent=1) + "\n")
    print(f"pristine failure names the restriction: {doc['pristine']['error_names_restriction']}")
    print(f"patched ok: {doc['patched']['ok']}  greedy_equal: {doc['patched'].get('greedy_equal')} "
          f"({doc['patched']['dtype']}, {doc['patched']['numerics']} numerics)")
    for variant, modes in doc["lossless"].items():
        for mode, res in modes.items():
            print(f"lossless {variant} {mode}: ok {res.get('ok')} greedy_equal {res.get('greedy_equal')} "
                  f"{res.get('reason', '')[:200]}")
    print(f"mtp: {doc['mtp'].get('ok')} {doc['mtp'].get('reason', '')}")
    for dtype, runs_ in doc["divergence"].items():
        for mode, d in runs_.items():
            if d:
                print(f"{dtype} {mode}: {d['equal_requests']}/{d['requests']} requests equal, "
                      f"{d['tokens_before_first_difference']}/{d['tokens']} tokens before the first difference")
    print(f"tokens/s: {doc['tokens_per_s']}  acceptance: {doc['acceptance_length']}")
    if kernel is not None:
        print(f"kernel: ok {kernel.get('ok')} max_abs_error {kernel.get('max_abs_error')} "
              f"ratio {kernel.get('ratio_median')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
