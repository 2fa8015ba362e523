"""The VRAM rule: do the weights, vLLM's runtime memory and the KV cache vLLM insists on fit the recipe's card?

The budget is ``gpu-memory-utilization x hardware.vram_gb``. The weights come from the checkpoint files
(``--model-dir``) or the recipe's footprint estimate. The KV cache is what vLLM requires before it starts, one
request of max-model-len over the target's and the drafter's layers, sized as vLLM sizes it (``kv_need.py``):
when it does not fit vLLM refuses to start, and the rule names the longest context that would, as vLLM's own
error does. The runtime memory (activations of a max-num-batched-tokens step, CUDA graphs, non-torch memory) is
what vLLM's own profile took in the card-fit runs of the 26B-A4B recipes (``runtime_gib``), measured on an H200
with bf16 weights standing in for NVFP4: on an SM120 card the GEMM and MoE kernels differ, and with them the
activation peak.
"""

from __future__ import annotations

from g4build.recipes.counts import int_arg
from g4build.recipes.fa_kv_dtype import fp8_kv_refused
from g4build.recipes.findings import CheckContext, Finding, serving_pin
from g4build.recipes.kv_need import (
    DFLASH_SLIDING_AS_FULL_PINS,
    LayerKind,
    layer_kinds,
    longest_context,
    need_bytes,
)
from g4build.recipes.mm_batched import mm_floor, serve_batched_tokens
from g4build.recipes.model import KvGeometry, Recipe

# vLLM's profile of the 26B-A4B recipes (tests/gpu/results/vllm-0.21.0-card-fit.json, `overhead_gib`: the budget
# less the weights loaded and the KV cache left), per drafter: DFlash 2.94 GiB at max-num-batched-tokens 2496 (the
# 24 GB row), 3.71 at 8192 and 7.43 at 32768; MTP 2.20 and 2.87 (its CUDA graphs are smaller: 0.19 GiB against
# DFlash's 0.89, which drafts 15 tokens a step). Linear between a method's points, each end's segment carried
# beyond it; a recipe without a measured drafter is charged DFlash's, the largest. CUDA_GRAPH_GIB of it is vLLM's
# CUDA graph estimate, which --enforce-eager drops.
RUNTIME_MEASURED: dict[str, tuple[tuple[int, float], ...]] = {  # (max-num-batched-tokens, GiB), ascending
    "dflash": ((2496, 2.94), (8192, 3.71), (32768, 7.43)),
    "mtp": ((2496, 2.20), (8192, 2.87)),
}
CUDA_GRAPH_GIB = {"dflash": 0.89, "mtp": 0.19}
RUNTIME_FALLBACK = "dflash"
# What vLLM loaded beyond the parameters' bytes, the same on every card and context in those runs
# (`stand_in_residual_gib`; not itemised: what the model registers beside its weights, its rotary tables among
# them): with it the rule's KV room is vLLM's available KV cache within 0.02 GiB in every run that reports one.
LOADED_BEYOND_WEIGHTS_GIB = {"dflash": 0.44, "mtp": 0.38}
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
MIN_SUGGESTED_CONTEXT = 4096  # a suggestion that leaves less than this is no suggestion
GIB = 1024**3


def _memory(recipe: Recipe, ctx: CheckContext) -> tuple[float, KvGeometry | None, KvGeometry | None, str] | None:
    """Weights (GiB), the target's and the drafter's KV geometry, and where they came from."""
    if ctx.target is not None:
        weights = ctx.target.weights_bytes + (ctx.drafter.weights_bytes if ctx.drafter else 0)
        # Gemma 4's MTP assistant reads the target's cache whatever its config says (vLLM's Gemma4Proposer)
        draft = ctx.drafter.kv if ctx.drafter is not None and recipe.method != "mtp" else None
        return weights / GIB, ctx.target.kv, draft, "the checkpoint files"
    if recipe.footprint is not None:
        fp = recipe.footprint
        return fp.weights_gib, fp.kv, fp.draft_kv, "the recipe's footprint estimate"
    return None


def drafter_sliding_as_full(recipe: Recipe, ctx: CheckContext) -> bool:
    """Whether the drafter's sliding layers are allocated as full attention (DFlash on the pins whose
    dflash-batched-verification does so)."""
    pin = serving_pin(recipe, ctx)
    return recipe.method == "dflash" and pin in DFLASH_SLIDING_AS_FULL_PINS


def _line(points: tuple[tuple[int, float], ...], tokens: int) -> float:
    """The measured points joined: the segment around ``tokens``, or the end segment nearest it."""
    last = len(points) - 2
    i = next((n for n in range(last) if tokens < points[n + 1][0]), last)
    (b0, g0), (b1, g1) = points[i], points[i + 1]
    return g0 + (g1 - g0) / (b1 - b0) * (tokens - b0)


def runtime_gib(batched: int, eager: bool = False, method: str | None = None) -> float:
    """vLLM's runtime memory at max-num-batched-tokens ``batched`` with a ``method`` drafter, from the measured
    profile (RUNTIME_MEASURED). Past a method's last point its line is not trusted below the fallback's (whose
    growth there, the target's activations, every drafter shares) less the difference in CUDA graphs."""
    key = method if method in RUNTIME_MEASURED else RUNTIME_FALLBACK
    tokens = max(batched, 0)
    value = _line(RUNTIME_MEASURED[key], tokens)
    if key != RUNTIME_FALLBACK and tokens > RUNTIME_MEASURED[key][-1][0]:
        shared = _line(RUNTIME_MEASURED[RUNTIME_FALLBACK], tokens) - CUDA_GRAPH_GIB[RUNTIME_FALLBACK]
        value = max(value, shared + CUDA_GRAPH_GIB[key])
    return value - (CUDA_GRAPH_GIB[key] if eager else 0.0)


def loaded_beyond_gib(method: str | None) -> float:
    return LOADED_BEYOND_WEIGHTS_GIB.get(str(method), LOADED_BEYOND_WEIGHTS_GIB[RUNTIME_FALLBACK])


RUNTIME_NAMES = {"dflash": "DFlash", "mtp": "MTP"}  # RUNTIME_MEASURED's methods as the rule's message names them


def runtime_basis(method: str | None) -> str:
    """Whose profile runtime_gib charged, for the rule's message."""
    if method in RUNTIME_MEASURED:
        return f"vLLM's profile of the 26B {RUNTIME_NAMES[str(method)]} recipe"
    return f"vLLM's profile of the 26B {RUNTIME_NAMES[RUNTIME_FALLBACK]} recipe, the largest measured"


def _suggest(kinds: list[LayerKind], weights: float, vram: float, util: float, batched: int, dtype_bytes: int,
             eager: bool, max_len: int, chunked: bool, floor: int = 0, method: str | None = None) -> str:
    """The smallest gpu-memory-utilization, at the smallest max-num-batched-tokens (vLLM serve's own default under
    70 GiB is 2048; never below ``floor``, the largest multimodal item vLLM takes in one step), that leaves room for
    a context of MIN_SUGGESTED_CONTEXT or more: '' when none does. Without chunked prefill vLLM wants
    max-num-batched-tokens of at least max-model-len: only the utilization moves."""
    start = max(batched, floor)  # below the floor vLLM refuses before memory matters: the way out starts there
    steps = {max(b, floor) for b in (4096, 2048)} if chunked else set()
    for new_util in sorted({util, *(u for u in (0.85, 0.9, 0.95) if u > util)}):
        for new_batched in sorted({start, *(b for b in steps if b < start)}):
            free = new_util * vram - weights - runtime_gib(new_batched, eager, method)
            if free <= 0:
                continue
            try:
                longest = longest_context(kinds, int(free * GIB), max_len, new_batched, dtype_bytes)
            except ValueError:  # pages vLLM could not unify: no figure to name
                return ""
            if longest >= MIN_SUGGESTED_CONTEXT:
                changes = [f"{name} {value:g}" for name, value, old in (
                    ("gpu-memory-utilization", new_util, util), ("max-num-batched-tokens", new_batched, batched))
                    if value != old]
                return f"with {' and '.join(changes)}, max-model-len up to {longest} fits"
    return ""


def rule_vram(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    memory = _memory(recipe, ctx)
    if memory is None:
        return [Finding(rule="vram", severity="info", message="VRAM budget not checked: no footprint in the "
                        "recipe and no --model-dir", hint="pass --model-dir to measure the checkpoint")]
    weights, kv, draft, basis = memory
    beyond = loaded_beyond_gib(recipe.method)
    weights += beyond
    basis += f", and {beyond:.2f} GiB vLLM loads beside them"
    util = recipe.args.get("gpu-memory-utilization", DEFAULT_GPU_MEMORY_UTILIZATION)
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1:
        return [Finding(rule="vram", severity="error",
                        message=f"gpu-memory-utilization must be a number in (0, 1], found {util!r}")]
    vram = recipe.hardware.vram_gb
    budget = util * vram
    max_len = int_arg(recipe, "max-model-len")
    batched, why = serve_batched_tokens(recipe, ctx, max_len or 0)
    assumed = f"; {why}" if why else ""
    eager = recipe.args.get("enforce-eager") is True
    runtime = runtime_gib(batched, eager, recipe.method)
    fixed = weights + runtime
    head = (f"budget {util:g} x {vram:g} GiB = {budget:.1f} GiB; weights {weights:.1f} GiB ({basis}); runtime "
            f"{runtime:.1f} GiB at max-num-batched-tokens {batched} ({runtime_basis(recipe.method)})")
    fp8 = "" if fp8_kv_refused(recipe) else ", use --kv-cache-dtype fp8"  # FA2 refuses an fp8 KV cache
    dtype_bytes = 1 if str(recipe.args.get("kv-cache-dtype") or "").startswith("fp8") else 2
    draft = draft if recipe.method else None  # a recipe without a drafter loads none
    as_full = drafter_sliding_as_full(recipe, ctx) and draft is not None
    kinds = layer_kinds(kv, draft, drafter_sliding_as_full=as_full) if kv is not None else []
    if weights >= budget:
        return [Finding(rule="vram", severity="warning",
                        message=f"{head}: the weights alone exceed the budget: expect an out-of-memory while loading",
                        hint="raise gpu-memory-utilization, use a smaller quantization or a card with more memory")]
    if fixed >= budget:
        chunked = recipe.args.get("enable-chunked-prefill") is not False
        least = mm_floor(recipe, ctx)
        floor = least[0] if least else 0
        way = (_suggest(kinds, weights, vram, util, batched, dtype_bytes, eager, max_len or 131072, chunked,
                        floor, recipe.method) if kinds else "")
        lower = "lower max-num-batched-tokens, " if chunked and batched > max(2048, floor) else ""
        return [Finding(rule="vram", severity="warning",
                        message=f"{head}{assumed}: no memory is left for the KV cache, vLLM will refuse to start "
                                "(\"No available memory for the cache blocks\")",
                        hint=(way + "; " if way else "") + lower + "raise gpu-memory-utilization or use a card "
                             "with more memory")]
    if kv is None or max_len is None:
        return [Finding(rule="vram", severity="info", message=f"{head}: KV cache not estimated (no KV geometry "
                        "or max-model-len)")]
    try:
        need = need_bytes(kinds, max_len, batched, dtype_bytes) / GIB
    except ValueError as exc:
        return [Finding(rule="vram", severity="info", message=f"{head}: KV cache not estimated ({exc})")]
    free = budget - fixed
    held = ("its sliding layers hold window - 1 + max-num-batched-tokens tokens each"
            + (", the drafter's layers as full attention" if as_full else ""))
    head += assumed
    if need > free:
        # beyond the budget less the weights, no runtime could make it start; within it, the measured runtime
        # decides, and it was measured on another GPU: the verdict is only likely
        left, verdict = ((budget - weights, "even with no runtime memory at all: vLLM will refuse to start")
                         if need > budget - weights else
                         (free, "after the runtime: vLLM will likely refuse to start"))
        longest = longest_context(kinds, int(free * GIB), max_len, batched, dtype_bytes)
        fix = (f"lower max-model-len to {longest} or less" if longest else "lower max-model-len") + \
            f" or max-num-batched-tokens{fp8}, or raise gpu-memory-utilization"
        return [Finding(rule="vram", severity="warning",
                        message=f"{head}; vLLM needs {need:.2f} GiB of KV cache for one request of max-model-len "
                                f"{max_len} ({held}) but {left:.1f} GiB are left {verdict}", hint=fix)]
    seqs = int_arg(recipe, "max-num-seqs")
    if seqs is not None and need * seqs > free:
        # max-num-seqs bounds concurrency, max-model-len one request: vLLM admits requests while KV blocks last,
        # so a card that holds fewer full-length requests than max-num-seqs still serves: worth knowing, not a
        # fault; a warning is for a start vLLM refuses
        fit = int(free // need)
        return [Finding(rule="vram", severity="info",
                        message=f"{head}; KV cache for max-num-seqs {seqs} x max-model-len {max_len} needs "
                                f"{need * seqs:.1f} GiB, {free:.1f} GiB are left: {fit} full-length "
                                f"request{'' if fit == 1 else 's'} fit at once, shorter ones share the rest "
                                "(vLLM queues or preempts what does not fit)",
                        hint=f"lower max-model-len / max-num-seqs{fp8}")]
    return [Finding(rule="vram", severity="info", message=f"{head}; KV cache {need:.2f} GiB per full-length "
                    f"request ({held}) fits in the {free:.1f} GiB left")]
