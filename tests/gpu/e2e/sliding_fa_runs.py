"""The tiny Gemma 4 target alone (no speculative decoding), one attention variant per engine start, timed and
recorded as JSON for sliding_fa_report.py:

  python tests/gpu/e2e/sliding_fa_runs.py --variant triton|fa --models OUTDIR --json RESULT.json

  triton  every layer on TRITON_ATTN (what vLLM 0.21.0's Gemma4Config forces when no backend is named)
  fa      the sliding layers (head_dim 256, window 128) on FlashAttention, the full layers (head_dim 512) on
          TRITON_ATTN: attention_config {"backend_per_kind": {"sliding_window": "FLASH_ATTN"}} (needs the wheel
          overlaid with gemma4-backend-decoupling v3 and mm-prefix-fa); image ranges go through mm-prefix-fa's
          exact recompute. G4E2E_FA_VERSION=2 forces FlashAttention 2 (SM120's; on an H100 the registry wheel's
          FA2 is sm_80 code that the driver JIT-compiles for minutes), default: vLLM's choice (FA3 on Hopper).

Both variants run the same engine settings and the same two workloads, so the report can put them side by side:

  text   32 token prompts of 200-1471 tokens (past the 128-token window)
  image  16 prompts with one image each (up to 70 soft tokens) after 10-900 words of text

Per workload: one untimed warm-up pass (Triton and FlashAttention compile or load the kernels the shapes use),
then REPS repetitions of a prefill pass (max_tokens=1) and a full pass (max_tokens=MAX_TOKENS, ignore_eos), prefix
caching off so every pass prefills; prefill tokens/s = prompt tokens / prefill time, decode tokens/s = the tokens
after the first / (full time - prefill time), medians taken by the report. Then one untimed greedy pass with the
top-2 logprobs of every token: the outputs the report compares. The engine's own layers are read back (which
backend each attention layer got). dtype and numerics come from G4E2E_DTYPE and G4E2E_NUMERICS as in
engine_runs.py, whose weight redraw, log capture and device helpers this script uses.

The JSON is always written, also when the engine does not start (ok false, error with the engine log's root
cause). Heavy imports happen inside functions.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import engine_runs as er  # beside this script: python puts the script's folder on sys.path
from jsonio import write

VARIANTS: dict[str, dict[str, Any]] = {
    "triton": {},
    "fa": {"backend_per_kind": {"sliding_window": "FLASH_ATTN"}},
}
FA_VERSION = os.environ.get("G4E2E_FA_VERSION", "")
STEP_TOKEN_BUDGET = 2048  # whole prompts per step where they fit: prefill is measured, not chunking
MAX_TOKENS = 64
REPS = 3
FA_VERSION_LOG = re.compile(r"Using FlashAttention version (\d)")


def build_workloads(meta: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Request specs (as engine_runs.build_requests writes them), identical for both variants."""
    rng = random.Random(4321)
    vocab, first = int(meta["vocab_size"]), int(meta["first_word_id"])
    bos = int(meta["special_ids"]["<bos>"])
    image_token = meta["image_token"]

    def words(n: int) -> list[int]:
        return [rng.randrange(first, vocab) for _ in range(n)]

    text = [{"id": f"t{i:02d}", "token_ids": [bos, *words(200 + 41 * i)], "max_tokens": MAX_TOKENS}
            for i in range(32)]
    sizes = [[224, 160], [160, 224], [96, 96], [224, 224]]
    image = []
    for j in range(16):
        before = " ".join(f"w{i}" for i in words(10 + 59 * j))
        after = " ".join(f"w{i}" for i in words(20 + 11 * j))
        image.append({"id": f"i{j:02d}", "image": sizes[j % len(sizes)], "text": f"{before} {image_token} {after}",
                      "max_tokens": MAX_TOKENS})
    return {"text": text, "image": image}


def attention_config(variant: str) -> dict[str, Any]:
    config = dict(VARIANTS[variant])
    if variant == "fa" and FA_VERSION:
        config["flash_attn_version"] = int(FA_VERSION)
    return config


def layer_backends(worker: Any) -> list[dict[str, Any]]:
    """Every decoder attention layer of the served model: head size, window, backend, FlashAttention version."""
    from vllm.model_executor.layers.attention import Attention

    out = []
    for name, module in worker.model_runner.get_model().named_modules():
        if isinstance(module, Attention):
            out.append({"name": name, "head_size": module.head_size, "sliding_window": module.sliding_window,
                        "backend": module.attn_backend.get_name(),
                        "fa_version": getattr(module.impl, "vllm_flash_attn_version", None)})
    return out


def greedy_record(req: dict[str, Any], output: Any) -> dict[str, Any]:
    """Token ids with each token's logprob and the top-2 gap at each position."""
    c = output.outputs[0]
    logprob: list[float | None] = []
    gaps: list[float | None] = []
    for token, pos in zip(c.token_ids, c.logprobs or [], strict=False):
        values = sorted((lp.logprob for lp in pos.values()), reverse=True) if pos else []
        chosen = pos.get(token) if pos else None
        logprob.append(None if chosen is None else round(float(chosen.logprob), 6))
        gaps.append(round(values[0] - values[1], 6) if len(values) > 1 else None)
    return {"id": req["id"], "image": "image" in req, "prompt_len": len(output.prompt_token_ids or []),
            "token_ids": list(c.token_ids), "logprob": logprob, "top2_gap": gaps}


def measure(llm: Any, reqs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from vllm import SamplingParams

    prompts = [er.to_vllm_prompt(r) for r in reqs]

    def params(max_tokens: int, logprobs: int | None = None) -> list[Any]:
        return [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs)
                for _ in reqs]

    def timed(max_tokens: int) -> tuple[float, list[Any]]:
        start = time.perf_counter()
        outs = llm.generate(prompts, params(max_tokens), use_tqdm=False)
        return time.perf_counter() - start, outs

    llm.generate(prompts, params(2), use_tqdm=False)  # warm-up: the kernels these shapes use
    timing: dict[str, Any] = {"requests": len(reqs), "reps": REPS, "max_tokens": MAX_TOKENS,
                              "prefill_s": [], "total_s": []}
    for _ in range(REPS):
        prefill_s, first = timed(1)
        total_s, full = timed(MAX_TOKENS)
        timing["prefill_s"].append(round(prefill_s, 6))
        timing["total_s"].append(round(total_s, 6))
    timing["prompt_tokens"] = sum(len(o.prompt_token_ids or []) for o in first)
    timing["output_tokens"] = sum(len(o.outputs[0].token_ids) for o in full)
    outs = llm.generate(prompts, params(MAX_TOKENS, logprobs=2), use_tqdm=False)
    return timing, [greedy_record(r, o) for r, o in zip(reqs, outs, strict=True)]


def engine_kwargs(variant: str, models: Path, meta: dict[str, Any], gpu_mem: float) -> dict[str, Any]:
    compilation = {"cudagraph_capture_sizes": list(er.CAPTURE_SIZES), **er.NUMERICS_COMPILATION.get(er.NUMERICS, {})}
    kw = er.engine_kwargs("baseline", models, meta, 0, gpu_mem, compilation)
    kw["enable_prefix_caching"] = False  # every timed pass prefills its prompts
    kw["max_num_batched_tokens"] = STEP_TOKEN_BUDGET
    kw["attention_config"] = attention_config(variant)
    return kw


def run(args: argparse.Namespace) -> dict[str, Any]:
    meta = json.loads((args.models / "meta.json").read_text())
    workloads = build_workloads(meta)
    result: dict[str, Any] = {
        "mode": "sliding-fa", "variant": args.variant, "dtype": er.DTYPE, "numerics": er.NUMERICS, "ok": False,
        "stage": "setup", "attention_config": attention_config(args.variant),
        "workloads": {name: [r["id"] for r in reqs] for name, reqs in workloads.items()},
    }
    log_path = args.json.with_suffix(".log")
    kw = engine_kwargs(args.variant, args.models, meta, args.gpu_memory_utilization)
    result["engine_kwargs"] = dict(kw)
    write(args.json, result)
    if er.NUMERICS.startswith("batch-invariant"):
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS",
                "VLLM_ALLOW_INSECURE_SERIALIZATION"):  # the last: functions travel to the engine core
        os.environ.setdefault(key, "1")
    with er.Tee(log_path) as tee:
        llm = None
        try:
            result["versions"] = er.versions()
            import cloudpickle
            from vllm import LLM

            cloudpickle.register_pickle_by_value(er)  # redraw_weights travels by value, as this script's own
            result["stage"] = "engine_start"
            write(args.json, result)
            start = time.perf_counter()
            llm = LLM(**kw)
            result["engine_start_s"] = round(time.perf_counter() - start, 2)
            if not args.dummy_weights:
                result["weights_redrawn"] = llm.collective_rpc(er.redraw_weights, args=(er.SEED,))
            result["layer_backends"] = llm.collective_rpc(layer_backends)[0]
            result["resolved"] = er.resolved_config(llm)
            result["stage"] = "generate"
            write(args.json, result)
            result["timing"], result["outputs"] = {}, {}
            for name, reqs in workloads.items():
                result["timing"][name], result["outputs"][name] = measure(llm, reqs)
                write(args.json, result)
            result["ok"] = True
            result["stage"] = "done"
        except BaseException as exc:
            result["error"] = (f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-4000:]}\n"
                               f"--- engine log (root cause) ---\n{er.root_cause(tee.text())}")
        finally:
            log = tee.text()
            versions = sorted({int(v) for v in FA_VERSION_LOG.findall(log)})
            from_layers = sorted({int(x["fa_version"]) for x in result.get("layer_backends") or []
                                  if x.get("fa_version") is not None and x.get("backend") == "FLASH_ATTN"})
            found = from_layers or versions
            result["flash_attn_version"] = found[0] if len(found) == 1 else (found or None)
            result["backends"] = er.log_facts(log)["backend_log"]
            result["log"] = str(log_path)
            write(args.json, result)
            if llm is not None:
                er.shutdown(llm)
    result["device"] = er.device_info()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=tuple(VARIANTS), required=True)
    ap.add_argument("--models", type=Path, required=True, help="OUTDIR of tiny_models.py")
    ap.add_argument("--json", type=Path, required=True, help="result file (RESULT.log beside it: the engine log)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--dummy-weights", action="store_true", help="keep vLLM's dummy weights (see engine_runs.py)")
    args = ap.parse_args(argv)
    if er.NUMERICS not in er.NUMERICS_CHOICES:
        print(f"G4E2E_NUMERICS={er.NUMERICS!r}: expected one of {', '.join(er.NUMERICS_CHOICES)}", file=sys.stderr)
        return 2
    if FA_VERSION not in ("", "2", "3"):
        print(f"G4E2E_FA_VERSION={FA_VERSION!r}: expected 2 or 3 (or unset: vLLM's choice)", file=sys.stderr)
        return 2
    if not (args.models / "meta.json").is_file():
        print(f"{args.models}/meta.json missing: run tiny_models.py first", file=sys.stderr)
        return 2
    result = run(args)
    write(args.json, result)
    print(f"[sliding_fa_runs] variant={args.variant} ok={result['ok']} stage={result.get('stage')} "
          f"fa={result.get('flash_attn_version')}"
          + (f" error={result.get('error', '')[:300]!r}" if not result["ok"] else ""))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # vLLM's atexit handlers can hang after a failed start; the JSON is written
