"""One vLLM engine start with the trained tiny models (train_models.py): outputs, acceptance, prefix-cache hits,
acceptance by context length and tokens/s.

  python acceptance_runs.py --variant VARIANT --models DIR --json OUT [--phases main,prefix,context,speed]
                            [--prefix-cache-retention-interval TOKENS|None]

VARIANT  target                   the trained target alone (the greedy reference)
         dflash                   target + the trained DFlash drafter, 15 speculative tokens, flash_attn
         mtp                      target + the trained gemma4_assistant drafter (train_mtp.py), 4 tokens
         dflash-no-embed-scale    the same with one piece of dflash-batched-verification left out, in this process
         dflash-no-softcap        (the engine core runs in-process, VLLM_ENABLE_V1_MULTIPROCESSING=0, so the
         dflash-no-window         series' own functions can be swapped before the engine is built):
         dflash-sliding-kv          0001's embedding scale / 0001's logit soft cap / 0005's per-layer window and
                                    causality (every layer full, non-causal: 0.21.0 before the series) / 0005's
                                    full-attention KV spec for sliding draft layers (sliding KV: #50169)
Phases   main     48 text prompts (tiny_lang.eval_prompts: the reference's set) in two batches of 24, then 4
                  image prompts: outputs, acceptance of each part from the engine's own counters
         prefix   12 fresh prompts, each alone, run cold and then again as a prefix-cache hit: outputs,
                  num_cached_tokens and acceptance per request (counter deltas)
         context  tiny_lang.long_context_prompts (64-3072 tokens; the drafter's window is 256), each alone
         speed    output tokens/s at concurrency 1, 8 and 22 (fixed 128 tokens, ignore_eos), after a warm-up
Numerics from G4E2E_DTYPE / G4E2E_NUMERICS as engine_runs.py (batch-invariant-eager: the strict check).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import engine_runs as er  # noqa: E402
import tiny_lang  # noqa: E402
from jsonio import write  # noqa: E402

VARIANTS = ("target", "dflash", "mtp", "dflash-no-embed-scale", "dflash-no-softcap", "dflash-no-window",
            "dflash-sliding-kv")
NUM_SPEC = 15
NUM_SPEC_MTP = 4
MAX_NUM_SEQS = 22  # the recipe's
STEP_BUDGET = 512
MAX_MODEL_LEN = 4096
CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 48, 64, 128, 256, 352, 512]


def ablate(variant: str) -> str | None:
    """Swap one piece of the series out in this process; returns what was swapped."""
    import vllm.model_executor.models.qwen3_dflash as qd

    if variant == "dflash-no-embed-scale":
        init = qd.DFlashQwen3Model.__init__

        @functools.wraps(init)  # vLLM reads the signature (vllm_config keyword)
        def model_init(self: Any, *a: Any, **kw: Any) -> None:
            init(self, *a, **kw)
            self.embed_scale = None

        qd.DFlashQwen3Model.__init__ = model_init  # type: ignore[method-assign]
        return "DFlashQwen3Model.embed_scale = None (no sqrt(hidden) on the drafter's embeddings)"
    if variant == "dflash-no-softcap":
        init2 = qd.DFlashQwen3ForCausalLM.__init__

        @functools.wraps(init2)
        def lm_init(self: Any, *a: Any, **kw: Any) -> None:
            init2(self, *a, **kw)
            self.logits_processor.soft_cap = None

        qd.DFlashQwen3ForCausalLM.__init__ = lm_init  # type: ignore[method-assign]
        return "drafter logits_processor.soft_cap = None"
    if variant == "dflash-no-window":
        qd.dflash_layer_attention = lambda config, layer_idx: (None, False)
        return "dflash_layer_attention -> (no window, non-causal) for every layer"
    if variant == "dflash-sliding-kv":
        from vllm.model_executor.layers.attention import Attention

        if not hasattr(qd, "DFlashDraftAttention"):
            # 0.21.0's series gives sliding draft layers full-attention KV through that class; later pins run
            # sliding draft layers with their own window upstream (V2 runner): no such piece to leave out
            raise RuntimeError("dflash-sliding-kv: this vLLM has no DFlashDraftAttention (the 0.21.0 series' "
                               "full-KV piece) to swap; the ablation applies to vllm-0.21.0 only")
        qd.DFlashDraftAttention.get_kv_cache_spec = Attention.get_kv_cache_spec  # type: ignore[method-assign]
        return "DFlashDraftAttention.get_kv_cache_spec -> Attention's (sliding-window KV for sliding layers)"
    return None


def retention_value(text: str | None) -> int | str | None:
    """--prefix-cache-retention-interval as vLLM's command line reads it ("None": dense), or UNSET for its default."""
    if text is None:
        return UNSET
    return None if text == "None" else int(text)


UNSET = "unset"  # leave prefix_cache_retention_interval to vLLM (0.29.0: 0, its default)


def engine_kwargs(variant: str, models: Path, meta: dict[str, Any], compilation: dict[str, Any],
                  gpu_mem: float = 0.5, retention: int | str | None = UNSET) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "model": str(models / "target"), "seed": 0, "dtype": er.DTYPE, "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": MAX_NUM_SEQS, "gpu_memory_utilization": gpu_mem, "enable_chunked_prefill": True,
        "enable_prefix_caching": True, "enforce_eager": False, "compilation_config": compilation,
        "limit_mm_per_prompt": {"image": 1, "video": 0}, "mm_processor_cache_gb": 0, "disable_log_stats": False,
        "hf_overrides": meta.get("target_hf_overrides") or {}, "max_num_batched_tokens": STEP_BUDGET,
    }
    kw.update(er.target_backend())
    if retention != UNSET:  # the launch scripts' setting for the pin (run_e2e.sh G4E2E_RETENTION)
        kw["prefix_cache_retention_interval"] = retention
    if variant == "mtp":
        kw["speculative_config"] = {"method": "mtp", "model": str(models / "mtp"),
                                    "num_speculative_tokens": NUM_SPEC_MTP}
    elif variant != "target":
        kw["speculative_config"] = {"method": "dflash", "model": str(models / "dflash"),
                                    "num_speculative_tokens": NUM_SPEC, "attention_backend": "flash_attn"}
        kw["max_num_batched_tokens"] = STEP_BUDGET + (NUM_SPEC - 1) * MAX_NUM_SEQS
    return kw


class Counters:
    def __init__(self, llm: Any, spec: bool) -> None:
        self.llm, self.spec = llm, spec
        self.last = self.read()

    def read(self) -> dict[str, Any]:
        if not self.spec:
            return {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "per_pos": []}
        return er.spec_metrics(self.llm)

    def delta(self) -> dict[str, Any]:
        now = self.read()
        d = {k: now[k] - self.last[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
        per = [a - (self.last["per_pos"][i] if i < len(self.last["per_pos"]) else 0)
               for i, a in enumerate(now["per_pos"])]
        d["per_pos"] = per
        d["acceptance_length"] = round(1 + d["num_accepted_tokens"] / d["num_drafts"], 4) if d["num_drafts"] else None
        self.last = now
        return d


def image_prompts() -> list[dict[str, Any]]:
    out = []
    for i, p in enumerate(tiny_lang.eval_prompts(seed=777)[:4]):
        ids = list(p["token_ids"])[1:]  # type: ignore[arg-type]
        cut = 10 + 40 * i
        text = f"{tiny_lang.text_of(ids[:cut])} <|image|> {tiny_lang.text_of(ids[cut:])}"
        out.append({"id": f"img{i}", "text": text,
                    "image": [96 + 32 * i, 128], "max_tokens": 64})
    return out


def generate(llm: Any, reqs: list[dict[str, Any]], logprobs: bool,
             max_tokens: int | None = None) -> list[dict[str, Any]]:
    from vllm import SamplingParams

    prompts = [er.to_vllm_prompt(r) for r in reqs]
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens or int(r["max_tokens"]), ignore_eos=True,
                             logprobs=2 if logprobs else None) for r in reqs]
    outs = llm.generate(prompts, params, use_tqdm=False)
    items = []
    for r, o in zip(reqs, outs, strict=True):
        c = o.outputs[0]
        item: dict[str, Any] = {"id": r["id"], "token_ids": list(c.token_ids), "prompt_len": len(o.prompt_token_ids),
                                "num_cached_tokens": getattr(o, "num_cached_tokens", None)}
        if c.logprobs is not None:
            item["top2_gap"] = er.top2_gaps(c.logprobs)
        items.append(item)
    return items


def phase_main(llm: Any, ctr: Counters, logprobs: bool) -> dict[str, Any]:
    prompts = tiny_lang.eval_prompts()
    out: dict[str, Any] = {"outputs": []}
    t0 = time.perf_counter()
    for i in (0, 24):
        out["outputs"] += generate(llm, prompts[i:i + 24], logprobs)
    out["text_s"] = round(time.perf_counter() - t0, 3)
    out["text_spec"] = ctr.delta()
    out["image_outputs"] = generate(llm, image_prompts(), logprobs)
    out["image_spec"] = ctr.delta()
    return out


def _fifth_margin(token: int, logprobs: dict[int, Any] | None) -> float | None:
    """The drawn token's logprob less the fifth largest among those vLLM returned (the top 5 and the drawn one);
    None when vLLM returned fewer than five or not the drawn token."""
    entry = (logprobs or {}).get(token)
    values = sorted((e.logprob for e in (logprobs or {}).values()), reverse=True)
    if entry is None or len(values) < 5:
        return None
    return float(entry.logprob - values[4])


def phase_sampler(llm: Any) -> dict[str, Any]:
    """vLLM's top-k/top-p sampler on 24 text prompts: greedy (temperature 0 never reaches the sampler) against
    temperature 1 with top_k=1, top_p=0.9, which must give the same tokens through whichever sampler vLLM took
    (FlashInfer's with VLLM_USE_FLASHINFER_SAMPLER=1); top_k=5 draws and their ranks among the logits; which
    sampling library this process mapped; and how often
    vLLM called FlashInfer's sampler for each (the engine core runs in this process). No seed: vLLM 0.21.0 samples
    a request with its own generator natively, never through FlashInfer (topk_topp_sampler.py forward_cuda)."""
    from vllm import SamplingParams
    from vllm.v1.sample.ops import topk_topp_sampler as tts

    calls = {"n": 0}
    original = tts.flashinfer_sample

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        return original(*args, **kwargs)

    reqs = tiny_lang.eval_prompts()[:24]
    prompts = [er.to_vllm_prompt(r) for r in reqs]
    runs: dict[str, list[list[int]]] = {}
    sampled: dict[str, int] = {}
    ranks: list[list[int]] = []
    margins: list[list[float | None]] = []
    tts.flashinfer_sample = counted  # forward_cuda looks the name up at each call
    try:
        # top_k=5 with logprobs: a real draw (an argmax would pass top_k=1), each token's rank among the raw
        # logits (vLLM's logprobs are taken before top-k) and its logprob less the fifth largest: vLLM's rank
        # counts every token at least as likely where topk left the draw out, so a tie with the fifth reads as 6
        # or worse; the margin is >= 0 exactly when the draw is in the top 5, ties included
        for name, kw in (("greedy", {"temperature": 0.0}),
                         ("top_k1", {"temperature": 1.0, "top_k": 1, "top_p": 0.9}),
                         ("top_k5", {"temperature": 1.0, "top_k": 5, "logprobs": 5})):
            params = SamplingParams(max_tokens=32, ignore_eos=True, **kw)
            calls["n"] = 0
            outs = llm.generate(prompts, params, use_tqdm=False)
            runs[name] = [list(o.outputs[0].token_ids) for o in outs]
            sampled[name] = calls["n"]
            if name == "top_k5":
                pairs = [list(zip(o.outputs[0].token_ids, o.outputs[0].logprobs or [], strict=False)) for o in outs]
                ranks = [[getattr(lp.get(t), "rank", None) for t, lp in row] for row in pairs]
                margins = [[_fifth_margin(t, lp) for t, lp in row] for row in pairs]
    finally:
        tts.flashinfer_sample = original
    maps = Path("/proc/self/maps").read_text().splitlines()
    libs = sorted({line.split()[-1] for line in maps if line.endswith("/sampling.so")})
    return {"ids": [r["id"] for r in reqs], **runs, "equal": runs["greedy"] == runs["top_k1"],
            "flashinfer_sample_calls": sampled, "seeded": False, "top_k5_ranks": ranks,
            "top_k5_margins": margins,
            "flashinfer_sampling_so": libs, "flashinfer_sampler_env": os.environ.get("VLLM_USE_FLASHINFER_SAMPLER")}


def one_by_one(llm: Any, ctr: Counters, reqs: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    rows = []
    for r in reqs:
        item = generate(llm, [r], False)[0]
        item.update({"run": tag, "spec": ctr.delta()})
        if "context" in r:
            item["context"] = r["context"]
        rows.append(item)
    return rows


def phase_prefix(llm: Any, ctr: Counters) -> dict[str, Any]:
    reqs = [{**p, "id": f"f{i:02d}"} for i, p in enumerate(tiny_lang.eval_prompts(seed=99)[::4])]
    rows = []
    for r in reqs:  # cold, then the same prompt again: a prefix-cache hit
        rows += one_by_one(llm, ctr, [r], "cold")
        rows += one_by_one(llm, ctr, [r], "hit")
    return {"rows": rows}


def phase_context(llm: Any, ctr: Counters) -> dict[str, Any]:
    return {"rows": one_by_one(llm, ctr, tiny_lang.long_context_prompts(), "context")}


def phase_speed(llm: Any, ctr: Counters) -> dict[str, Any]:
    prompts = tiny_lang.eval_prompts(seed=5150)
    res: dict[str, Any] = {"max_tokens": 128}
    generate(llm, prompts[:22], False, 128)  # warm-up: every batch size's kernels and graphs
    generate(llm, prompts[:1], False, 128)
    ctr.delta()
    for conc, rounds in ((1, 6), (8, 3), (22, 2)):
        n_tok, t_all = 0, 0.0
        for k in range(rounds):
            batch = prompts[(k * conc) % 40:(k * conc) % 40 + conc]
            t0 = time.perf_counter()
            items = generate(llm, batch, False, 128)
            t_all += time.perf_counter() - t0
            n_tok += sum(len(i["token_ids"]) for i in items)
        res[str(conc)] = {"requests": rounds * conc, "output_tokens": n_tok, "seconds": round(t_all, 3),
                          "tokens_per_s": round(n_tok / t_all, 1), "spec": ctr.delta()}
    return res


def run(args: argparse.Namespace) -> dict[str, Any]:
    models: Path = args.models
    meta = json.loads((models / "meta.json").read_text())
    compilation: dict[str, Any] = {"cudagraph_capture_sizes": CAPTURE_SIZES,
                                   **er.NUMERICS_COMPILATION.get(er.NUMERICS, {})}
    result: dict[str, Any] = {"variant": args.variant, "dtype": er.DTYPE, "numerics": er.NUMERICS, "ok": False,
                              "phases": args.phases, "stage": "setup", "num_speculative_tokens":
                              {"target": None, "mtp": NUM_SPEC_MTP}.get(args.variant, NUM_SPEC)}
    if er.NUMERICS.startswith("batch-invariant"):
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the ablations patch this process's modules
    if args.variant not in ("target", "dflash", "mtp"):
        # torch.compile's cache is keyed by the source, not by a swapped function: a cached graph of the whole
        # series would run instead of the ablation (a first pass measured no-embed-scale equal to the series)
        os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS"):
        os.environ.setdefault(k, "1")
    kw = engine_kwargs(args.variant, models, meta, compilation, args.gpu_memory_utilization,
                       retention_value(args.prefix_cache_retention_interval))
    result["engine_kwargs"] = dict(kw)
    result["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")}  # e.g. the FA version
    log_path = args.json.with_suffix(".log")
    with er.Tee(log_path) as tee:
        llm = None
        try:
            result["versions"] = er.versions()
            result["ablation"] = ablate(args.variant)
            from vllm import LLM

            result["stage"] = "engine_start"
            write(args.json, result)
            t0 = time.perf_counter()
            llm = LLM(**kw)
            result["engine_start_s"] = round(time.perf_counter() - t0, 2)
            result["resolved"] = er.resolved_config(llm)
            ctr = Counters(llm, args.variant != "target")
            for ph in args.phases.split(","):
                result["stage"] = ph
                write(args.json, result)
                t1 = time.perf_counter()
                if ph == "main":
                    result["main"] = phase_main(llm, ctr, args.variant == "target")
                elif ph == "prefix":
                    result["prefix"] = phase_prefix(llm, ctr)
                elif ph == "context":
                    result["context"] = phase_context(llm, ctr)
                elif ph == "speed":
                    result["speed"] = phase_speed(llm, ctr)
                elif ph == "sampler":
                    result["sampler"] = phase_sampler(llm)
                else:
                    raise ValueError(f"unknown phase {ph!r}: expected main, prefix, context, speed or sampler")
                result.setdefault("phase_s", {})[ph] = round(time.perf_counter() - t1, 2)
            result["ok"] = True
            result["stage"] = "done"
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=VARIANTS, required=True)
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--phases", default="main")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                    help="the engine's share of the GPU; lower lets correctness runs share one GPU (speed runs: alone)")
    ap.add_argument("--prefix-cache-retention-interval", default=None, metavar="TOKENS|None",
                    help="vLLM's prefix_cache_retention_interval (None: dense); unset: vLLM's default")
    args = ap.parse_args(argv)
    return 0 if run(args)["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
