"""Step costs of Gemma 4 26B-A4B at its published shapes, alone and with a DFlash or MTP drafter, in vLLM.

  python step_costs.py run --variant VARIANT --models DIR --json OUT [--concurrency 1,8,22]
                           [--contexts short=512,long=16384] [--output-tokens 64] [--repeats 2]
                           [--gpu-memory-utilization 0.9]
                           [--quantization NAME] [--mtp-folder mtp|mtp-standin] [--eager] [--time-drafter]
                           [--in-process] [--verify-split-kv Q]
  python step_costs.py fold RUN.json [RUN.json ...] --json OUT

VARIANT is target, dflash-K or mtp-K (the issue's set: target, dflash-3, dflash-8, dflash-15, mtp-2, mtp-4), one
engine start each; DIR is what real_size.py wrote. Weights are drawn in place (load_format "dummy"). For every
(concurrency, context) cell: a warm-up, then --repeats times the same prompts with prefix caching off, once for one
token (prefill) and once for --output-tokens (ignore_eos, greedy). Recorded per cell: the wall time of every pass,
vLLM's own inter-token latency histogram over the decode steps (one observation per request per step), its
speculative counters, and with --time-drafter the drafter's own time (the proposer's propose() bracketed by CUDA
syncs, the engine core in this process; the syncs cost overlap, so run it beside a plain run). fold turns the runs
into time per decode step (target), per speculative step (drafting k + verifying k + 1) and per draft, by cell, and
the ratio of each speculative step to the target's step in the same cell: the input of speedup.py.

Which figure is a cell's step (fold_cell's step_s): vLLM's inter-token latency where no request decodes while
another is still prefilling (one request, or every prompt in one scheduler step), since then every observation is
a decode step; otherwise the fastest full pass less the fastest prefill pass over the steps (wall), which carries
the interleaved prefill chunks' extra work and any hiccup of a single pass (the first runs had one pass each: a
slow prefill pass made the target's 22 x 512 cell negative).

What a random-weights run can show, and what it cannot:
- Nearly every draft is rejected (0 of 25,725 in a card-fit run; some DFlash k = 15 drafts at 16K context were
  accepted): tau is about 1 here, each step emits about one token. So the runs give step COSTS only. vLLM
  verifies all k drafts whatever survives, so the cost of a step at k is what it would be at any acceptance;
  speed-up(tau) = tau x target step / speculative step then needs tau from a trained drafter or a published
  acceptance, and the model must reproduce a published speed-up at that tau before it sets a k.
- An H200 is not an SM120 card: bandwidth, tensor cores, shared memory (FlashAttention's tiles) and the kernels
  vLLM picks differ. Ratios (speculative step / target step in one cell) carry further than absolute times.
- bf16 weights unless --quantization says otherwise: the recipes' 4-bit weights make a step read fewer bytes, which
  moves the target-step / verify-step ratio; say which ran.
- A random router spreads tokens over the experts about evenly; a trained one need not, so at batch > 1 the experts
  touched per step (the MoE's cost) may differ from a real model's.
- mtp-standin (every layer full attention at the target's full-layer KV geometry) stands in for the published
  assistant where vLLM cannot describe it (real_size.MTP_STANDIN_WHY); the result names the folder that ran.
Heavy imports (vllm, torch) happen inside run(), so --help, the argument parsing and fold work without them.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import random
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import engine_runs as er  # noqa: E402
from jsonio import write  # noqa: E402

VARIANTS = ("target", "dflash-3", "dflash-8", "dflash-15", "mtp-2", "mtp-4")
STEP_TOKEN_BUDGET = 8192  # tokens per scheduler step for prefill chunks; decode steps are far below it
ITL = "vllm:inter_token_latency_seconds"
_VARIANT = re.compile(r"^(?:target|(dflash|mtp)-([1-9][0-9]?))$")


# ---------------------------------------------------------------------------------------------------------------
# Arguments (pure)
# ---------------------------------------------------------------------------------------------------------------
def parse_variant(text: str) -> tuple[str, int]:
    """'target' -> ('target', 0); 'dflash-8' -> ('dflash', 8); 'mtp-2' -> ('mtp', 2)."""
    m = _VARIANT.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"variant {text!r}: expected target, dflash-K or mtp-K (K in 1..99)")
    return ("target", 0) if m.group(1) is None else (m.group(1), int(m.group(2)))


def parse_concurrency(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"concurrency {text!r}: expected positive integers, e.g. 1,8,22")
    return values


def parse_contexts(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if not name.strip() or not value.strip().isdigit() or int(value) < 1 or name.strip() in out:
            raise argparse.ArgumentTypeError(
                f"contexts {text!r}: expected NAME=TOKENS pairs with distinct names, e.g. short=512,long=16384")
        out[name.strip()] = int(value)
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="one engine start: every (concurrency, context) cell of one variant")
    run_p.add_argument("--variant", type=parse_variant, required=True)
    run_p.add_argument("--models", type=Path, required=True)
    run_p.add_argument("--json", type=Path, required=True)
    run_p.add_argument("--concurrency", type=parse_concurrency, default=parse_concurrency("1,8,22"))
    run_p.add_argument("--contexts", type=parse_contexts, default=parse_contexts("short=512,long=16384"))
    run_p.add_argument("--output-tokens", type=int, default=64)
    run_p.add_argument("--repeats", type=int, default=2, choices=range(1, 6), metavar="N",
                       help="passes of each kind per cell, the fastest kept (default 2: one slow pass, a hiccup of "
                            "the machine, no longer decides a cell)")
    run_p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    run_p.add_argument("--quantization", default=None, help="vLLM's quantization (default: none, bf16 weights)")
    run_p.add_argument("--mtp-folder", default="mtp", choices=("mtp", "mtp-standin"))
    run_p.add_argument("--eager", action="store_true", help="no torch.compile, no CUDA graphs (faster start)")
    run_p.add_argument("--time-drafter", action="store_true", help="bracket the proposer with CUDA syncs")
    run_p.add_argument("--in-process", action="store_true",
                       help="the engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), as --time-drafter "
                            "and --verify-split-kv need: run it for the plain runs beside them")
    run_p.add_argument("--verify-split-kv", type=int, default=0, metavar="Q",
                       help="TRITON_ATTN's split-KV kernel for up to Q query tokens a request, the target's "
                            "verification included: on a wheel with the series' dispatch (0007) its bound (1: as "
                            "released, the baseline), else an experiment on the released kernel "
                            "(run_verify_attention.py)")
    fold_p = sub.add_parser("fold", help="fold run JSONs into step costs per cell")
    fold_p.add_argument("runs", type=Path, nargs="+")
    fold_p.add_argument("--json", type=Path, required=True)
    return ap


def engine_kwargs(args: argparse.Namespace, meta: dict[str, Any]) -> dict[str, Any]:
    method, k = args.variant
    longest = max(args.contexts.values())
    kw: dict[str, Any] = {
        "model": str(args.models / "target"), "load_format": "dummy", "seed": 0, "dtype": "bfloat16",
        # room for the longest prompt, its output and a verification window
        "max_model_len": longest + args.output_tokens + k + 16,
        "max_num_seqs": max(args.concurrency), "gpu_memory_utilization": args.gpu_memory_utilization,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": False,  # the prefill pass and the full pass run the same prompts
        "enforce_eager": bool(args.eager), "limit_mm_per_prompt": {"image": 1, "video": 0},
        "mm_processor_cache_gb": 0, "disable_log_stats": False,  # the metrics read below need stats
        "hf_overrides": meta.get("target_hf_overrides") or {},
        "max_num_batched_tokens": STEP_TOKEN_BUDGET,
    }
    if args.quantization:
        kw["quantization"] = args.quantization
    kw.update(er.target_backend())
    if method == "dflash":
        kw["speculative_config"] = {"method": "dflash", "model": str(args.models / "dflash"),
                                    "num_speculative_tokens": k, "attention_backend": "flash_attn"}
        # vLLM takes (k - 1) * max_num_seqs draft slots off the step budget (engine_runs.engine_kwargs)
        kw["max_num_batched_tokens"] += (k - 1) * kw["max_num_seqs"]
    elif method == "mtp":
        kw["speculative_config"] = {"method": "mtp", "model": str(args.models / args.mtp_folder),
                                    "num_speculative_tokens": k}
    return kw


def prompts(meta: dict[str, Any], concurrency: int, tokens: int) -> list[list[int]]:
    """concurrency distinct prompts of exactly `tokens` ids (BOS + plain words), the same for every variant."""
    rng = random.Random(concurrency * 1_000_003 + tokens)
    first, vocab, bos = int(meta["first_word_id"]), int(meta["vocab_size"]), int(meta["special_ids"]["<bos>"])
    return [[bos] + [rng.randrange(first, vocab) for _ in range(tokens - 1)] for _ in range(concurrency)]


# ---------------------------------------------------------------------------------------------------------------
# vLLM's histograms (pure)
# ---------------------------------------------------------------------------------------------------------------
def hist_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    buckets = {b: after["buckets"][b] - before["buckets"].get(b, 0) for b in after["buckets"]}
    return {"count": after["count"] - before["count"], "sum": after["sum"] - before["sum"], "buckets": buckets}


def hist_quantile(hist: dict[str, Any], q: float) -> float | None:
    """Upper bound of the bucket holding quantile q (Prometheus buckets are cumulative counts by upper bound)."""
    if hist["count"] <= 0:
        return None
    bounds = sorted(hist["buckets"].items(), key=lambda kv: float(kv[0]))
    for bound, cumulative in bounds:
        if cumulative >= q * hist["count"]:
            return float(bound)
    return float("inf")


# ---------------------------------------------------------------------------------------------------------------
# Folding (pure)
# ---------------------------------------------------------------------------------------------------------------
def itl_is_clean(conc: int, tokens: int, budget: int | None) -> bool:
    """Whether every inter-token latency observed in a cell is a decode step: one request (its decode starts after
    its own prefill), or every prompt prefilled in one scheduler step of ``budget`` tokens."""
    return conc == 1 or (budget is not None and conc * tokens <= budget)


def fold_cell(method: str, k: int, raw: dict[str, Any], budget: int | None = None) -> dict[str, Any]:
    """Time per step of one cell from its raw record (see measure()); ``budget``: the tokens the run's scheduler
    puts in a step, which decides whether vLLM's inter-token latency is the cell's step (itl_is_clean)."""
    conc, n_out = int(raw["concurrency"]), int(raw["output_tokens"])
    repeats = int(raw.get("repeats") or 1)
    decode_s = raw["full_s"] - raw["prefill_s"]
    spec = raw.get("spec") or {}
    drafts = int(spec.get("num_drafts") or 0)
    accepted = int(spec.get("num_accepted_tokens") or 0)
    out: dict[str, Any] = {"method": method, "k": k, "concurrency": conc, "context": raw["context"],
                           "context_tokens": raw["context_tokens"], "output_tokens": n_out, "repeats": repeats,
                           "decode_s": decode_s}
    if method == "target":
        steps: float = n_out - 1  # every decode step emits one token per request
    else:
        if drafts == 0:
            raise ValueError(f"{method}-{k} at concurrency {conc}, {raw['context']}: no drafts counted; the drafter "
                             "did not run (see the run's log)")
        steps = drafts / conc / repeats  # one draft per request per speculative step, counted over every pass
        out["tau"] = 1 + accepted / drafts
        out["all_rejected"] = accepted == 0
    out["steps_per_request"] = steps
    out["step_wall_s"] = decode_s / steps if decode_s > 0 else None
    itl = raw.get("itl") or {}
    out["step_itl_s"] = itl["sum"] / itl["count"] if itl.get("count") else None
    out["step_itl_p50_s"] = hist_quantile(itl, 0.5) if itl.get("count") else None
    clean = itl_is_clean(conc, int(raw["context_tokens"]), budget)
    out["itl_clean"] = clean
    if clean and out["step_itl_s"] is not None:
        out["step_s"], out["step_basis"] = out["step_itl_s"], "itl"
    elif out["step_wall_s"] is not None:
        out["step_s"], out["step_basis"] = out["step_wall_s"], "wall"
    else:
        out["step_s"], out["step_basis"] = None, None
        out["unmeasured"] = (f"the fastest full pass ({raw['full_s']:.3f} s) was no slower than the fastest prefill "
                             f"pass ({raw['prefill_s']:.3f} s), and prompts were still prefilling while others "
                             "decoded, so vLLM's inter-token latency is no decode step either")
    if clean and out["step_wall_s"] and out["step_itl_s"]:
        out["wall_over_itl"] = out["step_wall_s"] / out["step_itl_s"]
    if raw.get("drafter_s") is not None and method != "target" and out["step_s"] is not None:
        out["draft_s"] = raw["drafter_s"] / (steps * repeats)
        out["per_draft_s"] = out["draft_s"] / k
        out["verify_s"] = out["step_s"] - out["draft_s"]
    return out


def fold(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every run's cells folded, and each speculative step's ratio to the target's in the same cell."""
    cells: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    variants = [run["variant"] for run in runs]
    twice = sorted({v for v in variants if variants.count(v) > 1})
    if twice:  # one cell a variant: a second run (another label, another attention) is a fold of its own
        raise ValueError(f"two runs of {', '.join(twice)}: fold each way of running a variant on its own, with "
                         "its own target run")
    for run in runs:
        method, k = parse_variant(run["variant"])
        if not run.get("ok"):
            failed.append({"variant": run["variant"], "stage": run.get("stage"),
                           "error": str(run.get("error", ""))[:600]})
        # what the scheduler fills a step with: vLLM's resolved max_num_scheduled_tokens (a drafter's draft slots
        # come on top of it in max_num_batched_tokens), else the budget asked for
        budget = ((run.get("resolved") or {}).get("max_num_scheduled_tokens")
                  or (run.get("engine_kwargs") or {}).get("max_num_batched_tokens"))
        for raw in run.get("cells", []):
            cells.append(fold_cell(method, k, raw, budget))
    target = {(c["concurrency"], c["context"]): c for c in cells if c["method"] == "target"}
    for c in cells:
        base = target.get((c["concurrency"], c["context"]))
        if c["method"] == "target" or base is None:
            continue
        for key, field in (("step_ratio", "step_s"), ("step_ratio_wall", "step_wall_s"),
                           ("step_ratio_itl", "step_itl_s")):
            # a ratio of steps measured alike only: a wall step over a latency step is no ratio of costs
            alike = key != "step_ratio" or c["step_basis"] == base["step_basis"]
            if c[field] and base[field] and alike:
                c[key] = c[field] / base[field]
    cells.sort(key=lambda c: (c["context_tokens"], c["concurrency"], c["method"] != "target", c["method"], c["k"]))
    first = runs[0] if runs else {}
    return {"cells": cells, "failed": failed, "device": first.get("device"), "versions": first.get("versions"),
            "runs": [{"variant": r["variant"], "ok": r.get("ok"), "mtp_folder": r.get("mtp_folder"),
                      "quantization": r.get("quantization"), "eager": r.get("eager"),
                      "engine_start_s": r.get("engine_start_s")} for r in runs],
            "note": "random weights: drafts are almost all rejected, tau near 1; step costs only (see step_costs.py)"}


# ---------------------------------------------------------------------------------------------------------------
# On the GPU
# ---------------------------------------------------------------------------------------------------------------
def read_itl(llm: Any) -> dict[str, Any]:
    total: dict[str, Any] = {"count": 0, "sum": 0.0, "buckets": {}}
    for m in llm.get_metrics():
        if m.name == ITL and hasattr(m, "buckets"):
            total["count"] += int(m.count)
            total["sum"] += float(m.sum)
            for b, n in m.buckets.items():
                total["buckets"][b] = total["buckets"].get(b, 0) + int(n)
    return total


def install_draft_timer() -> dict[str, float]:
    """Bracket every proposer's propose() with CUDA syncs; the outermost call's seconds accumulate (subclasses
    calling their base's propose() are counted once)."""
    import torch

    clock: dict[str, float] = {"seconds": 0.0, "calls": 0, "depth": 0}

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            clock["depth"] += 1
            outer = clock["depth"] == 1
            if outer:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                if outer:
                    torch.cuda.synchronize()
                    clock["seconds"] += time.perf_counter() - t0
                    clock["calls"] += 1
                clock["depth"] -= 1
        return timed

    for name in ("llm_base_proposer", "eagle", "dflash", "gemma4", "draft_model"):
        try:
            mod = importlib.import_module(f"vllm.v1.spec_decode.{name}")
        except ImportError:
            continue
        for obj in list(vars(mod).values()):
            if isinstance(obj, type) and "propose" in vars(obj) and obj.__module__ == mod.__name__:
                obj.propose = wrap(obj.propose)  # type: ignore[attr-defined]
    return clock


def install_verify_split(max_query: int) -> tuple[str, dict[str, int]]:
    """Give TRITON_ATTN the unified attention whose split-KV kernel takes up to ``max_query`` query tokens a request
    where its buffers hold them (run_verify_attention.widened; the CPU interpreter shows it computes the same
    attention), in this process. Returns the file it loaded and its calls as they come (CUDA graph captures and
    eager steps; a replayed graph calls no Python): every call, those with more than one query token a request,
    and those of them the widened dispatch may send to the split kernel (few enough query tokens, request rows
    and requests for its buffers and threshold), so that a run shows whether the experiment reached a kernel.
    A wheel that carries the series' own dispatch (dflash-batched-verification 0007) keeps its file: its bound is
    set to ``max_query`` (1 gives the released dispatch, the baseline beside it) and its calls are counted."""
    import tempfile

    sys.path.insert(0, str(HERE.parent))
    rva = importlib.import_module("run_verify_attention")
    backend = importlib.import_module("vllm.v1.attention.backends.triton_attn")
    ops = importlib.import_module("vllm.v1.attention.ops.triton_unified_attention")
    series = hasattr(ops, "verify_split_kv_max_query")
    if series:  # the wheel carries the series' dispatch (dflash-batched-verification 0007): set its bound (1: off)
        ops.verify_split_kv_max_query = max_query
        path, widened_attention = Path(ops.__file__), ops.unified_attention
    else:
        path = Path(tempfile.mkdtemp(prefix="g4-verify-split-")) / "triton_unified_attention_verify_split.py"
        path.write_text(rva.widened(Path(ops.__file__).read_text(encoding="utf-8"), max_query), encoding="utf-8")
        name = "vllm.v1.attention.ops.triton_unified_attention_verify_split"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        widened_attention = module.unified_attention
    counts = {"calls": 0, "verify_calls": 0, "verify_calls_eligible": 0}

    def counted(*a: Any, **kw: Any) -> Any:
        counts["calls"] += 1
        if int(kw.get("max_seqlen_q", 1)) > 1:
            counts["verify_calls"] += 1
            segm, threshold = kw.get("softmax_segm_output"), kw.get("seq_threshold_3D")
            full_layer = (kw.get("window_size") or (-1, -1))[0] < 0  # the series keeps sliding layers on 2D
            if (segm is not None and threshold is not None and kw["max_seqlen_q"] <= max_query
                    and kw["q"].shape[0] <= segm.shape[0] and len(kw["seqused_k"]) <= threshold
                    and (full_layer or not series)):
                counts["verify_calls_eligible"] += 1
        return widened_attention(*a, **kw)

    backend.unified_attention = counted
    return str(path), counts


def measure(llm: Any, meta: dict[str, Any], conc: int, context: str, tokens: int, n_out: int, spec: bool,
            clock: dict[str, float] | None, repeats: int = 1) -> dict[str, Any]:
    vllm = importlib.import_module("vllm")  # Any: vLLM ships no stubs, and is absent where this is linted
    SamplingParams, TokensPrompt = vllm.SamplingParams, importlib.import_module("vllm.inputs").TokensPrompt
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts(meta, conc, tokens)]

    def sp(n: int) -> Any:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)

    llm.generate(batch, sp(4), use_tqdm=False)  # warm-up: this batch's shapes
    itl0, spec0 = read_itl(llm), er.spec_metrics(llm) if spec else {}
    prefill_runs: list[float] = []
    full_runs: list[float] = []
    drafted = {"prefill": 0.0, "full": 0.0}  # the proposer's seconds in each kind of pass
    outs: Any = []

    def drafter_now() -> float:
        return clock["seconds"] if clock else 0.0

    for _ in range(repeats):
        d0, t0 = drafter_now(), time.perf_counter()
        llm.generate(batch, sp(1), use_tqdm=False)  # one token: no inter-token latency observed, no draft verified
        prefill_runs.append(time.perf_counter() - t0)
        # vLLM proposes after the prefill step too, drafts nothing will verify: the full pass does the same
        # once, so its decode steps' drafting is the full pass's less the prefill pass's
        drafted["prefill"] += drafter_now() - d0
        d0, t0 = drafter_now(), time.perf_counter()
        outs = llm.generate(batch, sp(n_out), use_tqdm=False)
        full_runs.append(time.perf_counter() - t0)
        drafted["full"] += drafter_now() - d0
    raw: dict[str, Any] = {"concurrency": conc, "context": context, "context_tokens": tokens, "output_tokens": n_out,
                           "repeats": repeats, "prefill_runs": prefill_runs, "full_runs": full_runs,
                           "prefill_s": min(prefill_runs), "full_s": min(full_runs),
                           "itl": hist_delta(itl0, read_itl(llm)),
                           "emitted": [len(o.outputs[0].token_ids) for o in outs],
                           # the last full pass's greedy tokens: equal across two ways of running a variant (the
                           # released and the split attention), the two computed the same; unequal proves nothing
                           # by itself (bf16 rounding may flip a near tie of random weights)
                           "outputs_sha256": hashlib.sha256(json.dumps(
                               [list(o.outputs[0].token_ids) for o in outs]).encode()).hexdigest()}
    if spec:
        now = er.spec_metrics(llm)
        raw["spec"] = {k: now[k] - spec0[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
    if clock:
        raw["drafter_s"] = drafted["full"] - drafted["prefill"]  # the decode steps' drafting, every pass
        raw["drafter_prefill_s"] = drafted["prefill"]
    return raw


def run(args: argparse.Namespace) -> dict[str, Any]:
    method, k = args.variant
    meta = json.loads((args.models / "meta.json").read_text())
    name = "target" if method == "target" else f"{method}-{k}"
    result: dict[str, Any] = {"variant": name, "ok": False, "stage": "setup", "cells": [],
                              "mtp_folder": args.mtp_folder if method == "mtp" else None,
                              "quantization": args.quantization, "eager": args.eager}
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS"):
        os.environ.setdefault(key, "1")
    if args.time_drafter or args.in_process or args.verify_split_kv:
        # the proposer must run in this process to be timed, the attention's dispatch to be replaced
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    result["in_process"] = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
    result["verify_split_kv"] = args.verify_split_kv
    kw = engine_kwargs(args, meta)
    result["engine_kwargs"] = dict(kw)
    with er.Tee(args.json.with_suffix(".log")) as tee:
        llm = None
        try:
            result["versions"] = er.versions()
            clock = install_draft_timer() if args.time_drafter and method != "target" else None
            if args.verify_split_kv:
                result["verify_split_kv_source"], split_calls = install_verify_split(args.verify_split_kv)
                result["verify_split_kv_calls"] = split_calls  # the same dict: filled in as the engine runs
            LLM = importlib.import_module("vllm").LLM

            result["stage"] = "engine_start"
            write(args.json, result)
            t0 = time.perf_counter()
            llm = LLM(**kw)
            result["engine_start_s"] = round(time.perf_counter() - t0, 2)
            result["resolved"] = er.resolved_config(llm)
            for context, tokens in sorted(args.contexts.items(), key=lambda kv: kv[1]):
                for conc in args.concurrency:
                    result["stage"] = f"{context}-c{conc}"
                    write(args.json, result)
                    result["cells"].append(measure(llm, meta, conc, context, tokens, args.output_tokens,
                                                   method != "target", clock, args.repeats))
            result["ok"], result["stage"] = True, "done"
        except BaseException as exc:
            result["error"] = er.failure(exc, tee.text())
        finally:
            result["backends"] = er.log_facts(tee.text())["backend_log"]
            write(args.json, result)
            if llm is not None:
                er.shutdown(llm)
    result["device"] = er.device_info()
    write(args.json, result)
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "fold":
        write(args.json, fold([json.loads(p.read_text()) for p in args.runs]))
        return 0
    return 0 if run(args)["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
