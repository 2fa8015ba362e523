"""The VRAM rule: do the weights, a runtime allowance and the KV cache vLLM insists on fit the recipe's card?

The budget is ``gpu-memory-utilization x hardware.vram_gb``. The weights come from the checkpoint files
(``--model-dir``) or the recipe's footprint estimate. The KV cache is what vLLM requires before it starts, one
request of max-model-len over the target's and the drafter's layers, sized as vLLM sizes it (``kv_need.py``):
when it does not fit vLLM refuses to start, and the rule names the longest context that would, as vLLM's own
error does. ``RUNTIME_OVERHEAD_GIB`` (activations of a max-num-batched-tokens step, CUDA graphs, the CUDA context)
is a floor, not a measurement: vLLM on an H200 with bf16 weights standing in for NVFP4 left 7.43 GiB of a 26B
DFlash recipe's budget to them at max-num-batched-tokens 32768 (tests/gpu/results/vllm-0.21.0-card-fit.json).
"""

from __future__ import annotations

from g4build.recipes.counts import int_arg
from g4build.recipes.fa_kv_dtype import fp8_kv_refused
from g4build.recipes.findings import CheckContext, Finding
from g4build.recipes.kv_need import DFLASH_SLIDING_AS_FULL_PINS, layer_kinds, longest_context, need_bytes
from g4build.recipes.model import KvGeometry, Recipe

RUNTIME_OVERHEAD_GIB = 1.5  # CUDA context, activations, CUDA graphs: a floor (see the module's docstring)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
LARGE_GPU_GIB, SERVE_BATCHED_LARGE, SERVE_BATCHED_SMALL = 70, 8192, 2048  # vLLM serve's max-num-batched-tokens
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


def _batched_tokens(recipe: Recipe, max_len: int) -> tuple[int, str]:
    """max-num-batched-tokens as vLLM will have it, and what was assumed when the recipe leaves it unset: vLLM
    0.21.0's default for `vllm serve` (engine/arg_utils.py, get_batch_defaults), 8192 on a GPU of 70 GiB or more,
    2048 below; without chunked prefill at least max-model-len."""
    batched = int_arg(recipe, "max-num-batched-tokens")
    if batched is not None:
        return batched, ""
    default = SERVE_BATCHED_LARGE if recipe.hardware.vram_gb >= LARGE_GPU_GIB else SERVE_BATCHED_SMALL
    if recipe.args.get("enable-chunked-prefill") is False:
        return max(max_len, default), ("; max-num-batched-tokens unset, chunked prefill off: vLLM takes "
                                       "max-model-len")
    return default, (f"; max-num-batched-tokens unset: vLLM serve's default on a {recipe.hardware.vram_gb:g} GB "
                     f"card, {default}")


def drafter_sliding_as_full(recipe: Recipe, ctx: CheckContext) -> bool:
    """Whether the drafter's sliding layers are allocated as full attention (DFlash on the pins whose
    dflash-batched-verification does so)."""
    pin = ctx.pin.name if ctx.pin is not None else recipe.pin
    return recipe.method == "dflash" and pin in DFLASH_SLIDING_AS_FULL_PINS


def rule_vram(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    memory = _memory(recipe, ctx)
    if memory is None:
        return [Finding(rule="vram", severity="info", message="VRAM budget not checked: no footprint in the "
                        "recipe and no --model-dir", hint="pass --model-dir to measure the checkpoint")]
    weights, kv, draft, basis = memory
    util = recipe.args.get("gpu-memory-utilization", DEFAULT_GPU_MEMORY_UTILIZATION)
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1:
        return [Finding(rule="vram", severity="error",
                        message=f"gpu-memory-utilization must be a number in (0, 1], found {util!r}")]
    budget = util * recipe.hardware.vram_gb
    fixed = weights + RUNTIME_OVERHEAD_GIB
    head = f"budget {util:g} x {recipe.hardware.vram_gb:g} GiB = {budget:.1f} GiB; weights {weights:.1f} GiB ({basis})"
    fp8 = "" if fp8_kv_refused(recipe) else ", use --kv-cache-dtype fp8"  # FA2 refuses an fp8 KV cache
    if fixed > budget:
        return [Finding(rule="vram", severity="warning",
                        message=f"{head} + {RUNTIME_OVERHEAD_GIB} GiB runtime do not fit: expect an out-of-memory",
                        hint="raise gpu-memory-utilization or use a card with more memory")]
    max_len = int_arg(recipe, "max-model-len")
    if kv is None or max_len is None:
        return [Finding(rule="vram", severity="info", message=f"{head}: KV cache not estimated (no KV geometry "
                        "or max-model-len)")]
    batched, assumed = _batched_tokens(recipe, max_len)
    dtype_bytes = 1 if str(recipe.args.get("kv-cache-dtype") or "").startswith("fp8") else 2
    draft = draft if recipe.method else None  # a recipe without a drafter loads none
    as_full = drafter_sliding_as_full(recipe, ctx) and draft is not None
    kinds = layer_kinds(kv, draft, drafter_sliding_as_full=as_full)
    try:
        need = need_bytes(kinds, max_len, batched, dtype_bytes) / GIB
    except ValueError as exc:
        return [Finding(rule="vram", severity="info", message=f"{head}: KV cache not estimated ({exc})")]
    free = budget - fixed
    held = ("its sliding layers hold window - 1 + max-num-batched-tokens tokens each"
            + (", the drafter's layers as full attention" if as_full else ""))
    head += assumed
    if need > free:
        # beyond the budget less the weights, no runtime allowance could make it start; within it, the allowance
        # (a floor) decides, so the verdict is only likely
        left, verdict = ((budget - weights, "even with no runtime memory at all: vLLM will refuse to start")
                         if need > budget - weights else
                         (free, f"after a {RUNTIME_OVERHEAD_GIB} GiB runtime allowance: vLLM will likely refuse to "
                                "start"))
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
