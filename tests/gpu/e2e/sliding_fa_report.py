"""Fold the sliding-FA runs of sliding_fa_runs.py into tests/gpu/results/vllm-0.21.0-sliding-fa.json: the tiny Gemma 4
target alone with every layer on Triton against its sliding layers on FlashAttention (full layers on Triton), side
by side: prefill and decode tokens/s with their ratios, and the greedy outputs of the two against each other.

  python tests/gpu/e2e/sliding_fa_report.py --runs STAGE/runs --out tests/gpu/results

Runs are ``sliding-fa-triton<suffix>.json`` and ``sliding-fa-fa<suffix>.json``, the suffix naming dtype, numerics,
a forced FlashAttention version and a repetition as run_e2e.sh does (``""`` bf16, ``-float16`` fp16, ``-bi``
batch-invariant, ``-fa2`` G4E2E_FA_VERSION=2, ``-r2`` G4E2E_REPEAT=2, in that order: ``-float16-fa2-r2``). Each
suffix is one side-by-side pair (both variants in one call, on one machine).

Speed. ``speed`` is the first pair on vLLM's default kernels (bf16 first, vLLM's own FA version first);
``speed_pairs`` holds every default-kernel pair's figures, ``speed_spread`` the FA / Triton ratios' min, median
and max over those pairs (all, and per FlashAttention version), and ``triton_spread`` how far the Triton variant's
own figures move between pairs of one dtype (max / min): a ratio inside that band is not a measured difference.

The tolerance. The two variants run the same schedule (same prompts, batches, chunking and graphs); only the
sliding layers' attention kernel differs, so their logits differ by rounding, and greedy tokens may part where the
top two logits are that close. The logits leave the LM head in the model dtype, below Gemma 4's final soft cap of
30 (the binade [16, 32) at most), one rounding of the logit moves a logprob by up to an ulp there, and each
backend's hidden states carry their own rounding: TOLERANCE is two ulps of the dtype at that magnitude (bf16:
2 x 2**-3 = 0.25 nats, fp16: 2 x 2**-6 = 0.03125 nats). Judged:

- on identical contexts (every position up to a request's first difference) the logprob of the greedy token
  differs by at most TOLERANCE between the variants (the largest seen is recorded as ``max_logprob_delta``);
- a request may part only where the Triton run's top two logprobs are within 2 x TOLERANCE (if every token's
  logprob moves by at most TOLERANCE, a gap wider than that cannot flip).

A mask or window defect is not rounding: the mm-prefix kernel check on the same GPU found the causal-only rows of
image ranges off by 1.3-2.8 (vllm-0.21.0-mm-prefix-kernel.json), orders of magnitude above these bounds. The
fp16 runs judge (10 mantissa bits: ~9x fewer ties than bf16); the others are kept beside them.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any, NamedTuple

PREFIX = "sliding-fa"
VARIANTS = ("triton", "fa")
WORKLOADS = ("text", "image")
# the run-name suffix run_e2e.sh gives: dtype (G4E2E_DTYPE), numerics (G4E2E_NUMERICS), a forced FlashAttention
# version (G4E2E_FA_VERSION) and a repetition (G4E2E_REPEAT)
SUFFIX = re.compile(r"(?P<dtype>-float16)?(?P<numerics>-bi(?:-casts|-eager)?)?(?P<fa>-fa[23])?"
                    r"(?P<repeat>-r[1-9][0-9]*)?")
NUMERICS = {None: "default", "-bi": "batch-invariant", "-bi-casts": "batch-invariant-casts",
            "-bi-eager": "batch-invariant-eager"}
# Which class of pairs judges the greedy comparison: the first that ran (every pair of it must pass). Speed is
# read from vLLM's default kernels (bf16 first): batch-invariant kernels are slower by design and say nothing
# about what users run.
JUDGED = ("float16-default", "float16-batch-invariant", "float16-batch-invariant-eager",
          "float16-batch-invariant-casts", "bfloat16-default", "bfloat16-batch-invariant",
          "bfloat16-batch-invariant-eager", "bfloat16-batch-invariant-casts")
KINDS = ("prefill_tokens_per_s", "decode_tokens_per_s")
TOLERANCE = {"bfloat16": 2 * 2.0**-3, "float16": 2 * 2.0**-6, "float32": 2 * 2.0**-19}
SLIDING_BACKEND = {"triton": "TRITON_ATTN", "fa": "FLASH_ATTN"}


def run_name(variant: str, suffix: str) -> str:
    return f"{PREFIX}-{variant}{suffix}"


class Pair(NamedTuple):
    """One side-by-side pair: its run-name suffix and what the suffix says."""

    suffix: str
    dtype: str
    numerics: str
    fa: int | None  # the FlashAttention version forced (None: vLLM's choice)
    repeat: int

    @property
    def cls(self) -> str:  # the class the greedy judgement and the speed reading go by
        return f"{self.dtype}-{self.numerics}"

    @property
    def key(self) -> str:
        return self.cls + (f"-fa{self.fa}" if self.fa else "") + (f"-r{self.repeat}" if self.repeat > 1 else "")

    def order(self) -> tuple[int, int, int, int]:
        return (int(self.dtype != "bfloat16"), list(NUMERICS.values()).index(self.numerics), self.fa or 0, self.repeat)


def parse_suffix(suffix: str) -> Pair | None:
    match = SUFFIX.fullmatch(suffix)
    if match is None:
        return None
    return Pair(suffix, "float16" if match["dtype"] else "bfloat16", NUMERICS[match["numerics"]],
                int(match["fa"][3:]) if match["fa"] else None, int(match["repeat"][2:]) if match["repeat"] else 1)


def find_pairs(runs: Path) -> list[Pair]:
    """Every suffix with a run of either variant in ``runs``, in reading order (names run_e2e.sh does not give
    are left out)."""
    found: dict[str, Pair] = {}
    for path in runs.glob(f"{PREFIX}-*.json"):
        rest = path.stem[len(PREFIX) + 1:]
        for variant in VARIANTS:
            if rest == variant or rest.startswith(variant + "-"):
                pair = parse_suffix(rest[len(variant):])
                if pair is not None:
                    found[pair.suffix] = pair
    return sorted(found.values(), key=Pair.order)


def load(runs: Path, name: str) -> dict[str, Any] | None:
    path = runs / f"{name}.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        return {"ok": False, "error": f"{path.name} is not JSON: {exc}"}
    return doc if isinstance(doc, dict) else {"ok": False, "error": f"{path.name} holds no object"}


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rates(timing: dict[str, Any]) -> dict[str, float | None]:
    """Prefill and decode tokens/s of one workload from its repetitions (medians of the times).

    prefill: prompt tokens / time of the max_tokens=1 pass; decode: the tokens after the first / (time of the
    full pass - time of the max_tokens=1 pass), both passes over the same prompts with prefix caching off."""
    prefill_s = median([float(t) for t in timing.get("prefill_s") or []])
    total_s = median([float(t) for t in timing.get("total_s") or []])
    prompt_tokens = int(timing.get("prompt_tokens") or 0)
    decode_tokens = int(timing.get("output_tokens") or 0) - int(timing.get("requests") or 0)
    prefill = prompt_tokens / prefill_s if prefill_s else None
    decode = None
    if prefill_s is not None and total_s is not None and total_s > prefill_s and decode_tokens > 0:
        decode = decode_tokens / (total_s - prefill_s)
    return {"prefill_tokens_per_s": prefill, "decode_tokens_per_s": decode, "prefill_s": prefill_s,
            "total_s": total_s}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def speed(triton: dict[str, Any], fa: dict[str, Any]) -> dict[str, Any]:
    """Per workload: both variants' prefill and decode tokens/s and FA / Triton."""
    out: dict[str, Any] = {}
    for workload in WORKLOADS:
        t = rates((triton.get("timing") or {}).get(workload) or {})
        f = rates((fa.get("timing") or {}).get(workload) or {})
        out[workload] = {
            kind: {"triton": _round(t[kind]), "sliding_fa": _round(f[kind]), "ratio": ratio(f[kind], t[kind])}
            for kind in ("prefill_tokens_per_s", "decode_tokens_per_s")
        }
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def compare_request(ref: dict[str, Any], other: dict[str, Any], tolerance: float) -> dict[str, Any]:
    """One request's greedy tokens, the reference (Triton) against the other (FA)."""
    a, b = list(ref.get("token_ids") or []), list(other.get("token_ids") or [])
    lp_a, lp_b = ref.get("logprob") or [], other.get("logprob") or []
    gaps = ref.get("top2_gap") or []
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    same = len(a) if first is None else first
    # Positions with identical contexts and the same greedy token: logprobs comparable one to one.
    deltas = [abs(float(lp_a[i]) - float(lp_b[i])) for i in range(min(same, len(lp_a), len(lp_b)))
              if lp_a[i] is not None and lp_b[i] is not None]
    gap = gaps[first] if first is not None and first < len(gaps) else None
    return {
        "first_difference": first,
        "max_logprob_delta": max(deltas) if deltas else None,
        "compared_positions": len(deltas),
        "reference_top2_gap_there": gap,
        # a difference is rounding only at a near-tie of the reference (and with its logprobs known there)
        "difference_is_rounding": first is None or (gap is not None and gap <= 2 * tolerance),
    }


def compare(triton: dict[str, Any], fa: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Greedy outputs of both variants, per workload and in all, judged against TOLERANCE[dtype]."""
    tolerance = TOLERANCE.get(dtype, TOLERANCE["bfloat16"])
    doc: dict[str, Any] = {"dtype": dtype, "tolerance": tolerance}
    verdicts = []
    worst = 0.0
    for workload in WORKLOADS:
        ref = {str(o["id"]): o for o in (triton.get("outputs") or {}).get(workload) or []}
        got = {str(o["id"]): o for o in (fa.get("outputs") or {}).get(workload) or []}
        per = {key: compare_request(item, got.get(key) or {}, tolerance) for key, item in ref.items()}
        deltas = [r["max_logprob_delta"] for r in per.values() if r["max_logprob_delta"] is not None]
        delta = max(deltas) if deltas else None
        ok = bool(ref) and set(ref) == set(got) and all(r["difference_is_rounding"] for r in per.values()) \
            and delta is not None and delta <= tolerance
        verdicts.append(ok)
        worst = max(worst, delta or 0.0)
        parted = {k: r for k, r in per.items() if r["first_difference"] is not None}
        doc[workload] = {
            "requests": len(ref),
            "equal_requests": len(ref) - len(parted),
            "tokens": sum(len(o.get("token_ids") or []) for o in ref.values()),
            "max_logprob_delta": delta,
            "within_tolerance": ok,
            "missing_requests": sorted(set(ref) ^ set(got)),
            "differences": parted,
        }
    doc["max_logprob_delta"] = worst
    doc["within_tolerance"] = all(verdicts)
    return doc


def layer_backends_as_asked(run: dict[str, Any], variant: str) -> bool:
    """Sliding layers on the variant's backend, full layers on Triton (read from the engine's own layers)."""
    layers = run.get("layer_backends") or []
    if not layers:
        return False
    for layer in layers:
        want = SLIDING_BACKEND[variant] if layer.get("sliding_window") else "TRITON_ATTN"
        if layer.get("backend") != want:
            return False
    return any(layer.get("sliding_window") for layer in layers) and any(
        not layer.get("sliding_window") for layer in layers)


def device_of(runs: list[dict[str, Any] | None]) -> dict[str, Any]:
    for run in runs:
        if run and isinstance(run.get("device"), dict) and run["device"].get("name"):
            return dict(run["device"])
    return {}


def spread(values: list[float]) -> dict[str, Any] | None:
    return None if not values else {"min": round(min(values), 4), "median": round(statistics.median(values), 4),
                                    "max": round(max(values), 4), "pairs": len(values)}


def build(runs: Path, notes: tuple[str, ...] = ()) -> dict[str, Any]:
    found = find_pairs(runs)
    loaded = {p.suffix: (load(runs, run_name("triton", p.suffix)), load(runs, run_name("fa", p.suffix))) for p in found}
    ok = {p.suffix: loaded[p.suffix] for p in found
          if all(r and r.get("ok") for r in loaded[p.suffix])}
    ok_pairs = [p for p in found if p.suffix in ok]
    doc: dict[str, Any] = {
        "what": "tiny Gemma 4 target alone on the overlaid vLLM 0.21.0 wheel: every layer on TRITON_ATTN against "
                "its sliding layers on FlashAttention (attention_config.backend_per_kind; full layers on "
                "TRITON_ATTN), text-only and with image ranges",
        "script": "tests/gpu/e2e/run_e2e.sh sliding-fa",
        "device": device_of([r for pair in loaded.values() for r in pair]),
        "tolerance": {k: TOLERANCE[k] for k in ("bfloat16", "float16")},
        "notes": list(notes),
    }
    doc["runs"] = {
        run_name(v, p.suffix): None if r is None else {
            k: r.get(k) for k in ("ok", "dtype", "numerics", "engine_start_s", "flash_attn_version", "error")}
        for p in found for v, r in zip(VARIANTS, loaded[p.suffix], strict=True)
    }
    doc["layer_backends_as_asked"] = {
        run_name(v, p.suffix): layer_backends_as_asked(r, v)
        for p in ok_pairs for v, r in zip(VARIANTS, ok[p.suffix], strict=True)
    }
    fa_of = {p.suffix: ok[p.suffix][1].get("flash_attn_version") for p in ok_pairs}
    fa_versions = {v for v in fa_of.values() if v is not None}
    doc["flash_attn_version"] = sorted(fa_versions)[0] if len(fa_versions) == 1 else sorted(fa_versions) or None
    default = [p for p in ok_pairs if p.numerics == "default"]
    doc["speed"] = None if not default else {
        "pair": default[0].key, "dtype": default[0].dtype, "numerics": default[0].numerics,
        "flash_attn_version": fa_of[default[0].suffix], **speed(*ok[default[0].suffix])}
    pairs_speed = {p.key: {"dtype": p.dtype, "flash_attn_version": fa_of[p.suffix], **speed(*ok[p.suffix])}
                   for p in default}
    doc["speed_pairs"] = pairs_speed
    doc["speed_spread"] = speed_spread(pairs_speed)
    doc["triton_spread"] = triton_spread(pairs_speed)
    doc["greedy"] = {p.key: compare(*ok[p.suffix], p.dtype) for p in ok_pairs}
    judged = next((cls for cls in JUDGED if any(p.cls == cls for p in ok_pairs)), None)
    doc["judged"] = judged
    doc["judged_pairs"] = [p.key for p in ok_pairs if p.cls == judged]
    doc["within_tolerance"] = bool(judged is not None
                                   and all(doc["greedy"][k]["within_tolerance"] for k in doc["judged_pairs"])
                                   and all(doc["layer_backends_as_asked"].values()))
    return doc


def speed_spread(pairs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """FA / Triton over the pairs: all of them, and per FlashAttention version that ran."""
    groups: dict[str, list[dict[str, Any]]] = {"all": list(pairs.values())}
    for figures in pairs.values():
        groups.setdefault(f"fa{figures['flash_attn_version']}", []).append(figures)
    return {name: {w: {k: spread([f[w][k]["ratio"] for f in members if f[w][k]["ratio"] is not None])
                       for k in KINDS} for w in WORKLOADS}
            for name, members in groups.items()}


def triton_spread(pairs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The Triton variant's own figures between pairs of one dtype (max / min): the run-to-run noise."""
    out: dict[str, Any] = {}
    for dtype in sorted({f["dtype"] for f in pairs.values()}):
        members = [f for f in pairs.values() if f["dtype"] == dtype]
        if len(members) < 2:
            continue
        out[dtype] = {}
        for w in WORKLOADS:
            out[dtype][w] = {}
            for k in KINDS:
                values = [f[w][k]["triton"] for f in members if f[w][k]["triton"]]
                out[dtype][w][k] = round(max(values) / min(values), 4) if len(values) > 1 else None
    return out


def scrub(text: str, runs: Path) -> str:
    """No machine paths in the repo: the stage folder the runs name becomes <stage>."""
    for path in sorted(runs.glob(f"{PREFIX}-*.json")):
        log = (load(runs, path.stem) or {}).get("log")
        if log:
            stage = str(Path(log).parent.parent)
            if len(stage) > 1:
                text = text.replace(stage + "/", "<stage>/")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", default="vllm-0.21.0")
    ap.add_argument("--note", action="append", default=[], help="a line for the result's notes (repeatable)")
    args = ap.parse_args(argv)
    doc = build(args.runs, tuple(args.note))
    if not doc["runs"]:
        print(f"no {PREFIX}-*.json runs in {args.runs}: run `run_e2e.sh sliding-fa` first", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"{args.name}-sliding-fa.json"
    out.write_text(scrub(json.dumps(doc, indent=1) + "\n", args.runs))
    print(f"wrote {out}")
    for workload, figures in (doc["speed"] or {}).items():
        if isinstance(figures, dict):
            for kind, row in figures.items():
                print(f"speed {workload} {kind}: triton {row['triton']} sliding-fa {row['sliding_fa']} "
                      f"ratio {row['ratio']}")
    for name, group in (doc["speed_spread"] or {}).items():
        for workload, kinds in group.items():
            for kind, row in kinds.items():
                if row:
                    print(f"ratio spread {name} {workload} {kind}: min {row['min']} median {row['median']} "
                          f"max {row['max']} over {row['pairs']} pairs")
    for key, res in doc["greedy"].items():
        print(f"greedy {key}: within tolerance {res['within_tolerance']} (max logprob delta "
              f"{res['max_logprob_delta']}, tolerance {res['tolerance']})")
    print(f"judged {doc['judged']}: within_tolerance {doc['within_tolerance']}; layers as asked "
          f"{doc['layer_backends_as_asked']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
