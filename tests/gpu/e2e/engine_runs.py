"""One vLLM engine run over the tiny Gemma 4 models of tiny_models.py, recorded as JSON.

  python tests/gpu/e2e/engine_runs.py --mode baseline|dflash|mtp --models OUTDIR --json RESULT.json

  baseline  the target alone, greedy (temperature 0)
  dflash    target + DFlash drafter, speculative_config attention_backend "flash_attn" (on the pristine 0.21.0
            wheel the engine is expected not to start: "partial multimodal token full attention not supported")
  mtp       target + the gemma4_assistant drafter (vLLM's Gemma4 MTP path), when tiny_models.py wrote one

Every mode runs the same prompts with the same engine settings (dummy weights, seed 0, bf16, chunked prefill and
prefix caching on, CUDA graphs on): a batch of 26 requests of different lengths (two with an image, prompts longer
than the per-step token budget so prefill is chunked) and a batch of 17 requests (one with an image), so the
per-request output token ids of baseline and a speculative mode can be compared for equality.

The JSON is always written, also when the engine does not start (ok false, error: the exception and the root
cause from the engine's log; the engine core runs in a child process whose traceback only reaches its log, so
stdout and stderr are teed into RESULT.log and searched). A recorded failure exits 0; the caller decides.
Heavy imports (vllm, torch, PIL) happen inside functions, so --help and py_compile work without them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from jsonio import write  # beside this script: python puts the script's folder on sys.path

MODES = ("baseline", "dflash", "mtp")
# The restriction the pristine 0.21.0 wheel hits (vllm/v1/attention/backend.py validate_configuration).
# The users' refusal in each pin's words: 0.21.0 (vllm/v1/attention/backend.py), 0.29.0 and 0.33.0 (the reason from
# backends/flash_attn.py, raised in platforms/cuda.py)
RESTRICTIONS = ("partial multimodal token full attention not supported",
                "mm_prefix (PrefixLM bidirectional attention) requires FlashAttention v4")

MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 32
STEP_TOKEN_BUDGET = 256  # tokens the scheduler may schedule per step, the same in every mode
CAPTURE_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256]
DEFAULT_SPEC_TOKENS = {"dflash": 7, "mtp": 4}
SEED = 0
DTYPE = os.environ.get("G4E2E_DTYPE", "bfloat16")  # float16 has 3 more mantissa bits: the precision check
# "batch-invariant" runs every mode under vLLM's own VLLM_BATCH_INVARIANT=1: each token's logits then no longer
# depend on which kernels the batch's shape selects (Triton attention's split-KV "3D" decode kernel for one-token
# queries vs the 2D kernel for the k+1-token verification window; cuBLAS split-K), so greedy speculative decoding
# must reproduce the target's tokens bit for bit and any difference is a defect, not rounding.
# With torch.compile's Inductor the target's graph itself differs between modes: a DFlash drafter asks the target
# for auxiliary hidden states, extra graph outputs that change what Inductor fuses and so where bf16 rounding
# happens (Inductor keeps fused bf16 chains in fp32). "batch-invariant-casts" adds Inductor's
# emulate_precision_casts (every op rounds where eager would), "batch-invariant-eager" runs the captured graphs
# op by op (compile backend "eager"); CUDA graphs stay on in both.
NUMERICS = os.environ.get("G4E2E_NUMERICS", "default")
NUMERICS_CHOICES = ("default", "batch-invariant", "batch-invariant-casts", "batch-invariant-eager")
NUMERICS_COMPILATION: dict[str, dict[str, Any]] = {
    "batch-invariant-casts": {"inductor_compile_config": {"emulate_precision_casts": True}},
    "batch-invariant-eager": {"backend": "eager"},
}


# ---------------------------------------------------------------------------------------------------------------
# Prompts: deterministic, identical in every mode
# ---------------------------------------------------------------------------------------------------------------
def _words(rng: random.Random, n: int, first: int, vocab: int) -> list[int]:
    return [rng.randrange(first, vocab) for _ in range(n)]


def build_requests(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Request specs (no vLLM objects): id, batch, token ids or text, image size, max_tokens."""
    rng = random.Random(1234)
    vocab, first = int(meta["vocab_size"]), int(meta["first_word_id"])
    bos = int(meta["special_ids"]["<bos>"])
    image_token = meta["image_token"]
    shared = _words(rng, 200, first, vocab)  # a prefix several prompts share (prefix caching)

    def text(ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)

    reqs: list[dict[str, Any]] = []
    # Batch A: 26 requests. 24 token prompts (several longer than the step budget, some sharing a prefix).
    lengths = [5, 9, 17, 33, 64, 100, 150, 200, 255, 256, 257, 300, 380, 450, 520, 600, 700, 12, 40, 90, 128,
               129, 511, 777]
    for i, n in enumerate(lengths):
        ids = (shared[: min(n, 200)] + _words(rng, max(0, n - 200), first, vocab)) if i % 3 == 0 and n > 200 \
            else _words(rng, n, first, vocab)
        reqs.append({"id": f"a{i:02d}", "batch": "A", "token_ids": [bos, *ids],
                     "max_tokens": 16 + (i * 7) % 49})
    # Two image requests in batch A: one short, one whose image comes after 300 words (prefill chunks before it).
    reqs.append({"id": "a24", "batch": "A", "image": [224, 160],
                 "text": f"{text(_words(rng, 20, first, vocab))} {image_token} {text(_words(rng, 30, first, vocab))}",
                 "max_tokens": 40})
    reqs.append({"id": "a25", "batch": "A", "image": [160, 224],
                 "text": f"{text(_words(rng, 300, first, vocab))} {image_token} {text(_words(rng, 12, first, vocab))}",
                 "max_tokens": 56})
    # Batch B: 17 requests that decode together (17 is padded to a larger CUDA graph size).
    for j in range(16):
        n = 8 + 7 * j
        ids = (shared[:160] + _words(rng, n, first, vocab)) if j % 4 == 1 else _words(rng, n, first, vocab)
        reqs.append({"id": f"b{j:02d}", "batch": "B", "token_ids": [bos, *ids], "max_tokens": 48})
    reqs.append({"id": "b16", "batch": "B", "image": [96, 96],
                 "text": f"{text(_words(rng, 10, first, vocab))} {image_token} {text(_words(rng, 5, first, vocab))}",
                 "max_tokens": 48})
    return reqs


def _image(width: int, height: int, salt: int) -> Any:
    from PIL import Image

    img = Image.new("RGB", (width, height))
    px = img.load()
    for y in range(height):
        for x in range(width):
            px[x, y] = ((x * 7 + salt * 31) % 256, (y * 5 + salt * 17) % 256, ((x ^ y) * 3 + salt) % 256)
    return img


def request_image(req: dict[str, Any]) -> Any:
    """The image of a request with one ({"image": [w, h]}), seeded by its id: the same in every run and route."""
    w, h = req["image"]
    return _image(w, h, sum(map(ord, req["id"])))


def to_vllm_prompt(req: dict[str, Any]) -> Any:
    if "image" in req:
        return {"prompt": req["text"], "multi_modal_data": {"image": request_image(req)}}
    return {"prompt_token_ids": list(req["token_ids"])}


def expected_decode_batch_sizes(reqs: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Running-request counts while a batch decodes (once every prompt is in), as requests finish."""
    out: dict[str, list[int]] = {}
    for batch in sorted({r["batch"] for r in reqs}):
        lens = sorted(r["max_tokens"] for r in reqs if r["batch"] == batch)
        sizes = sorted({sum(1 for x in lens if x > t) for t in [0, *lens]} - {0}, reverse=True)
        out[batch] = sizes
    return out


# ---------------------------------------------------------------------------------------------------------------
# Log capture: the engine core (a child process) logs its errors and backend choices to the inherited fds
# ---------------------------------------------------------------------------------------------------------------
class Tee:
    """Send fds 1 and 2 (and children's) through `tee -a LOG`, keeping the live output."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.saved: tuple[int, int] | None = None

    def __enter__(self) -> Tee:
        self.log.write_text("")
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            self.saved = (os.dup(1), os.dup(2))
            r, w = os.pipe()
            self.proc = subprocess.Popen(["tee", "-a", str(self.log)], stdin=r, stdout=self.saved[0])
            os.close(r)
            os.dup2(w, 1)
            os.dup2(w, 2)
            os.close(w)
        except OSError:
            self.proc = None
        return self

    def text(self) -> str:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if self.saved is not None:
            os.dup2(self.saved[0], 1)
            os.dup2(self.saved[1], 2)
            os.close(self.saved[0])
            os.close(self.saved[1])
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def failure(exc: BaseException, log_text: str) -> str:
    """A failed engine run as its result records it: the exception, the traceback's end and the engine log's
    root cause (acceptance_runs.py and step_costs.py)."""
    return (f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}\n--- log ---\n"
            f"{root_cause(log_text)}")


def root_cause(log: str, limit: int = 6000) -> str:
    """The engine's own traceback(s) from the log, last ones first in importance."""
    lines = log.splitlines()
    hits = [i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln]
    picked: list[str] = []
    for i in hits[-3:]:
        block = lines[i: i + 60]
        picked.append("\n".join(block))
    restr = [ln for ln in lines if any(r in ln for r in RESTRICTIONS)]
    text = "\n--\n".join(picked)
    if restr:
        text = "\n".join(restr[-3:]) + "\n--\n" + text
    return text[-limit:]


def log_facts(log: str) -> dict[str, Any]:
    keep_backend = re.compile(
        r"(Using \S+ (attention )?backend|Forcing TRITON_ATTN|heterogeneous head dimensions|"
        r"DFlash draft layers span|Gemma4 MTP: draft layer|disable_chunked_mm_input|aux(iliary)? layers|"
        r"batch.invariant|Model Runner)",
        re.I)
    keep_graph = re.compile(r"(cuda ?graph|cudagraph|Capturing|Graph capturing|torch\.compile|Compil)", re.I)
    backends, graphs = [], []
    for ln in log.splitlines():
        if keep_backend.search(ln) and len(backends) < 40:
            backends.append(ln.strip()[-300:])
        elif keep_graph.search(ln) and len(graphs) < 40:
            graphs.append(ln.strip()[-300:])
    return {"backend_log": backends, "cuda_graph_log": graphs}


def device_info() -> dict[str, Any]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip().splitlines()[0]
        name, cap, driver, mem = (x.strip() for x in out.split(","))
        return {"name": name, "capability": cap, "driver": driver, "memory": mem}
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return {}


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    for mod in ("vllm", "torch", "transformers", "tokenizers"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "?")
            if mod == "vllm":
                out["vllm_path"] = str(Path(m.__file__).parent)
        except Exception as exc:
            out[mod] = f"unavailable: {type(exc).__name__}"
    try:
        import vllm.v1.spec_decode.independent_draft  # noqa: F401

        out["g4build_overlay"] = True
    except Exception:
        out["g4build_overlay"] = False
    return out


# ---------------------------------------------------------------------------------------------------------------
# Weights: vLLM's dummy loader fills every tensor with U(-1e-3, 1e-3) from a seed that depends only on the
# tensor's size, so all layers are equal and Gemma 4's plain RMSNorm (x * w) multiplies every layer's output by
# ~1e-3: the next token then depends on the current token alone, and a KV-cache or verification bug could not
# change a single output token. Re-draw the weights in place (same storage, so captured CUDA graphs and compiled
# code see them) with sizes a trained model has, seeded by parameter name so the target is bit-identical in
# every mode; drafter tensors shared with the target (embedding, LM head, KV) are left to the target's draw.
# The first session's H100 runs (`earlier` in the result) used q/k norm weights ~1, before the d**-0.25 below.
# ---------------------------------------------------------------------------------------------------------------
def redraw_weights(worker: Any, seed: int) -> dict[str, int]:
    import math
    import zlib

    import torch

    runner = worker.model_runner
    models = [("target", runner.get_model())]
    draft = getattr(getattr(runner, "drafter", None), "model", None)
    if draft is not None:
        models.append(("draft", draft))
    seen: set[int] = set()
    counts: dict[str, int] = {}
    with torch.no_grad():
        for tag, model in models:
            n = 0
            for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
                if p.data_ptr() in seen or not torch.is_floating_point(p) or p.numel() == 0:
                    continue
                seen.add(p.data_ptr())
                g = torch.Generator(device=p.device)
                g.manual_seed((seed * 1_000_003 + zlib.crc32(f"{tag}:{name}".encode())) % (2**62))
                noise = torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32)
                if p.ndim >= 2:
                    value = noise / math.sqrt(max(1, p[0].numel()))
                elif name.endswith("bias"):
                    value = noise * 0.02
                elif name.endswith(("q_norm.weight", "k_norm.weight")):
                    # Gemma 4 attends with scaling 1.0 and lets the learned q/k norm weights set the score scale;
                    # at 1.0 the scores of a random model have std sqrt(head_dim) (16 at 256), a softmax so sharp
                    # that bf16 rounding flips which key wins. d**-0.25 on each side gives scores of std ~1.
                    value = (1.0 + 0.05 * noise) * p.shape[0] ** -0.25
                else:  # other norm weights and per-layer scalars
                    value = 1.0 + 0.05 * noise
                p.copy_(value.to(p.dtype))
                n += 1
            counts[tag] = n
    return counts


# ---------------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------------
def target_backend() -> dict[str, str]:
    """The target's attention backend from G4E2E_TARGET_BACKEND, if set. vLLM 0.26.0+ puts a Gemma 4 target on
    FlashAttention 4 where the GPU could run it (H100: yes, SM120: no), and FA4 needs nvidia-cutlass-dsl;
    TRITON_ATTN is what such a target gets on SM120, and what the users' pristine failure happens beside."""
    backend = os.environ.get("G4E2E_TARGET_BACKEND")
    return {"attention_backend": backend} if backend else {}


def engine_kwargs(mode: str, models: Path, meta: dict[str, Any], num_spec: int,
                  gpu_mem: float, compilation: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "model": str(models / "target"),
        "load_format": "dummy",
        "seed": SEED,
        "dtype": DTYPE,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": MAX_NUM_SEQS,
        "gpu_memory_utilization": gpu_mem,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "enforce_eager": False,
        "compilation_config": compilation,
        "limit_mm_per_prompt": {"image": 2, "video": 0},
        # vLLM 0.21.0's processor cache runs Gemma 4's HF processor on the prompt text alone (profiling too), and
        # transformers 5.17's Gemma4Processor.validate_inputs refuses image tokens without images; without the
        # cache text and images are processed together.
        "mm_processor_cache_gb": 0,
        "disable_log_stats": False,
        # transformers 5.17 drops text_config.global_head_dim (tiny_models.py): put it back.
        "hf_overrides": meta.get("target_hf_overrides") or {},
    }
    kw.update(target_backend())
    budget = STEP_TOKEN_BUDGET
    if mode == "dflash":
        kw["speculative_config"] = {
            "method": "dflash",
            "model": str(models / "dflash"),
            "num_speculative_tokens": num_spec,
            "attention_backend": "flash_attn",
        }
        # VllmConfig._set_max_num_scheduled_tokens takes (num_spec - 1) * max_num_seqs draft slots off
        # max_num_batched_tokens for parallel drafting; add them so the scheduler keeps the same step budget.
        kw["max_num_batched_tokens"] = budget + (num_spec - 1) * MAX_NUM_SEQS
    elif mode == "mtp":
        kw["speculative_config"] = {
            "method": "mtp",
            "model": str(models / "mtp"),
            "num_speculative_tokens": num_spec,
        }
        kw["max_num_batched_tokens"] = budget
    else:
        kw["max_num_batched_tokens"] = budget
    return kw


def spec_metrics(llm: Any) -> dict[str, Any]:
    totals: dict[str, Any] = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "per_pos": []}
    names = {
        "vllm:spec_decode_num_drafts": "num_drafts",
        "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
    }
    for m in llm.get_metrics():
        if m.name in names:
            totals[names[m.name]] += int(getattr(m, "value", 0))
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            vals = list(getattr(m, "values", []))
            per = totals["per_pos"]
            per.extend([0] * (len(vals) - len(per)))
            for i, v in enumerate(vals):
                per[i] += int(v)
    n = totals["num_drafts"]
    totals["acceptance_length"] = (1 + totals["num_accepted_tokens"] / n) if n else None
    totals["per_pos_acceptance_rate"] = [v / n for v in totals["per_pos"]] if n else []
    return totals


def resolved_config(llm: Any) -> dict[str, Any]:
    """What the front end resolved (the engine core may round capture sizes further for spec decode)."""
    out: dict[str, Any] = {}
    try:
        vc = llm.llm_engine.vllm_config
        cc = vc.compilation_config
        out["compilation_mode"] = str(cc.mode)
        out["cudagraph_mode"] = str(cc.cudagraph_mode)
        out["cudagraph_capture_sizes"] = list(cc.cudagraph_capture_sizes or [])
        out["max_cudagraph_capture_size"] = cc.max_cudagraph_capture_size
        out["attention_backend"] = str(vc.attention_config.backend)
        sc = vc.scheduler_config
        out["max_num_batched_tokens"] = sc.max_num_batched_tokens
        out["max_num_scheduled_tokens"] = getattr(sc, "max_num_scheduled_tokens", None)
        out["disable_chunked_mm_input"] = getattr(sc, "disable_chunked_mm_input", None)
        out["is_mm_prefix_lm"] = vc.model_config.is_mm_prefix_lm
        out["global_head_dim"] = getattr(vc.model_config.hf_text_config, "global_head_dim", None)
        if vc.speculative_config is not None:
            spc = vc.speculative_config
            out["spec_method"] = spc.method
            out["spec_attention_backend"] = str(spc.attention_backend)
            out["draft_architectures"] = list(spc.draft_model_config.architectures)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def top2_gaps(logprobs: Any) -> list[float | None]:
    """Per output position, the gap between the two best logprobs vLLM returned (None with fewer than two)."""
    gaps: list[float | None] = []
    for pos in logprobs:
        vals = sorted((lp.logprob for lp in pos.values()), reverse=True) if pos else []
        gaps.append(round(vals[0] - vals[1], 6) if len(vals) > 1 else None)
    return gaps


def shutdown(llm: Any) -> None:
    """Stop the engine; never hang the run on it."""
    timer = threading.Timer(90, lambda: os._exit(0))
    timer.daemon = True
    timer.start()
    try:
        eng = getattr(llm, "llm_engine", None)
        core = getattr(eng, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
    except Exception:
        pass
    timer.cancel()


def run(args: argparse.Namespace) -> dict[str, Any]:
    models: Path = args.models
    meta = json.loads((models / "meta.json").read_text())
    reqs = build_requests(meta)
    num_spec = args.num_speculative_tokens or DEFAULT_SPEC_TOKENS.get(args.mode, 0)
    compilation = json.loads(args.compilation_config) if args.compilation_config else {
        "cudagraph_capture_sizes": list(CAPTURE_SIZES), **NUMERICS_COMPILATION.get(NUMERICS, {}),
    }
    result: dict[str, Any] = {
        "mode": args.mode,
        "dtype": DTYPE,
        "numerics": NUMERICS,
        "ok": False,
        "stage": "setup",
        "requests": len(reqs),
        "image_requests": [r["id"] for r in reqs if "image" in r],
        "batches": {b: [r["id"] for r in reqs if r["batch"] == b] for b in ("A", "B")},
        "expected_decode_batch_sizes": expected_decode_batch_sizes(reqs),
        "chunked_prefill": True,
        "prefix_caching": True,
        "step_token_budget": STEP_TOKEN_BUDGET,
        "prompt_lengths": {r["id"]: len(r.get("token_ids", [])) or None for r in reqs},
    }
    if args.mode in DEFAULT_SPEC_TOKENS:
        result["num_speculative_tokens"] = num_spec
    if "dflash" in str(models.resolve()).lower() or "eagle" in str(models.resolve()).lower():
        # SpeculativeConfig guesses the method from substrings of the draft path (config/speculative.py).
        result["warning"] = "the models path contains 'dflash' or 'eagle': vLLM may guess the method from it"
    if args.mode == "mtp" and not (models / "mtp" / "config.json").is_file():
        reason = (meta.get("mtp") or {}).get("reason") or "tiny_models.py wrote no mtp drafter"
        result.update({"stage": "skipped", "reason": reason})
        return result

    log_path = args.json.with_suffix(".log")
    kw = engine_kwargs(args.mode, models, meta, num_spec, args.gpu_memory_utilization, compilation)
    result["engine_kwargs"] = dict(kw)
    result["max_num_batched_tokens"] = kw["max_num_batched_tokens"]
    result["cuda_graphs"] = {"enforce_eager": False, "requested": compilation}
    result["non_capture_batch_sizes"] = sorted(
        {n for sizes in result["expected_decode_batch_sizes"].values() for n in sizes} - set(CAPTURE_SIZES))
    write(args.json, result)

    if NUMERICS.startswith("batch-invariant"):
        os.environ["VLLM_BATCH_INVARIANT"] = "1"  # read by vllm.envs in this process and the engine core
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    # redraw_weights travels to the engine core as a pickled function (LLM.collective_rpc)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

    with Tee(log_path) as tee:
        llm = None
        try:
            result["versions"] = versions()
            from vllm import LLM, SamplingParams

            result["stage"] = "engine_start"
            write(args.json, result)
            t0 = time.perf_counter()
            llm = LLM(**kw)
            result["engine_start_s"] = round(time.perf_counter() - t0, 2)
            if not args.dummy_weights:
                result["weights_redrawn"] = llm.collective_rpc(redraw_weights, args=(SEED,))
            result["resolved"] = resolved_config(llm)
            import vllm.envs

            result["resolved"]["VLLM_BATCH_INVARIANT"] = bool(vllm.envs.VLLM_BATCH_INVARIANT)
            result["cuda_graphs"]["resolved"] = {
                k: result["resolved"].get(k)
                for k in ("compilation_mode", "cudagraph_mode", "cudagraph_capture_sizes", "max_cudagraph_capture_size")
            }
            result["stage"] = "generate"
            write(args.json, result)

            outputs: dict[str, Any] = {}
            gen_s = 0.0
            n_out = 0
            for batch in ("A", "B"):
                breqs = [r for r in reqs if r["batch"] == batch]
                prompts = [to_vllm_prompt(r) for r in breqs]
                params = [
                    SamplingParams(temperature=0.0, max_tokens=r["max_tokens"], ignore_eos=True,
                                   logprobs=(2 if args.mode == "baseline" else None))
                    for r in breqs
                ]
                t1 = time.perf_counter()
                outs = llm.generate(prompts, params, use_tqdm=False)
                dt = time.perf_counter() - t1
                gen_s += dt
                result.setdefault("batch_generate_s", {})[batch] = round(dt, 3)
                for r, o in zip(breqs, outs, strict=True):
                    c = o.outputs[0]
                    item: dict[str, Any] = {
                        "id": r["id"], "token_ids": list(c.token_ids), "image": "image" in r,
                        "prompt_len": len(o.prompt_token_ids or []), "finish_reason": c.finish_reason,
                        "num_cached_tokens": getattr(o, "num_cached_tokens", None),
                    }
                    if c.logprobs is not None:
                        item["top2_gap"] = top2_gaps(c.logprobs)
                    outputs[r["id"]] = item
                    n_out += len(c.token_ids)
            result["outputs"] = [outputs[r["id"]] for r in reqs]
            result["output_tokens"] = n_out
            result["generate_s"] = round(gen_s, 3)
            result["tokens_per_s"] = round(n_out / gen_s, 1) if gen_s > 0 else None
            result["prefix_cache_hit_requests"] = [k for k, v in outputs.items() if (v["num_cached_tokens"] or 0) > 0]
            if args.mode in DEFAULT_SPEC_TOKENS:
                try:
                    sd = spec_metrics(llm)
                    result["spec_decode"] = sd
                    result["acceptance_length"] = sd["acceptance_length"]
                except Exception as exc:
                    result["spec_decode"] = {"error": f"{type(exc).__name__}: {exc}"}
            result["ok"] = True
            result["stage"] = "done"
        except BaseException as exc:
            tb = traceback.format_exc()
            result["ok"] = False
            result["error"] = (f"{type(exc).__name__}: {exc}\n{tb[-4000:]}\n--- engine log (root cause) ---\n"
                               f"{root_cause(tee.text())}")
            result["error_names_restriction"] = any(r in tee.text() or r in str(exc) for r in RESTRICTIONS)
        finally:
            facts = log_facts(tee.text())
            result["backends"] = facts["backend_log"]
            result["cuda_graphs"]["log"] = facts["cuda_graph_log"]
            result["log"] = str(log_path)
            write(args.json, result)
            if llm is not None:
                shutdown(llm)
    result["device"] = device_info()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=MODES, required=True)
    ap.add_argument("--models", type=Path, required=True, help="OUTDIR of tiny_models.py")
    ap.add_argument("--json", type=Path, required=True, help="result file (RESULT.log beside it: the engine log)")
    ap.add_argument("--num-speculative-tokens", type=int, default=0,
                    help=f"default {DEFAULT_SPEC_TOKENS}")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--compilation-config", default="",
                    help="JSON for LLM(compilation_config=...); default: explicit cudagraph_capture_sizes "
                         f"{CAPTURE_SIZES}, vLLM's default compile mode")
    ap.add_argument("--dummy-weights", action="store_true",
                    help="keep vLLM's dummy weights (U(-1e-3, 1e-3)) instead of redrawing them (redraw_weights)")
    args = ap.parse_args(argv)
    if NUMERICS not in NUMERICS_CHOICES:
        print(f"G4E2E_NUMERICS={NUMERICS!r}: expected one of {', '.join(NUMERICS_CHOICES)}", file=sys.stderr)
        return 2
    if not (args.models / "meta.json").is_file():
        print(f"{args.models}/meta.json missing: run tiny_models.py first", file=sys.stderr)
        return 2
    result = run(args)
    write(args.json, result)
    print(f"[engine_runs] mode={result['mode']} ok={result['ok']} stage={result.get('stage')} "
          f"tokens/s={result.get('tokens_per_s')} acceptance={result.get('acceptance_length')}"
          + (f" error={result.get('error', '')[:300]!r}" if not result["ok"] else ""))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's atexit handlers can hang after a failed start; the JSON is written.
    os._exit(code)
