"""The rule for ``sliding_attention_backend``: a model's sliding-window layers on FlashAttention (vLLM's
``attention_config.backend_per_kind``), with its other layers where they were (Gemma 4: TRITON_ATTN for the
512-dim full layers). Valid only where it can work; pure, like every rule."""

from __future__ import annotations

from g4build.recipes.findings import FA2_MAX_HEAD_DIM, CheckContext, Finding
from g4build.recipes.model import Recipe

# Sliding-window layers on FlashAttention (sliding_attention_backend), per pin: the series it needs and the first
# version of each that serves it. 0.21.0 has no per-kind backends upstream (gemma4-backend-decoupling v3 adds
# backend_per_kind; 0.26.0 and later have them); on every pin FlashAttention without FA4 serves multimodal-prefix
# layers (every Gemma 4 checkpoint with a vision tower) only through mm-prefix-fa's exact recompute, taken where
# FlashAttention is named (v3; v4 for 0.26.0 and 0.29.0, their first variants). A pin not listed is not known to
# serve it.
SLIDING_FA_SERIES: dict[str, dict[str, int]] = {
    "vllm-0.21.0": {"gemma4-backend-decoupling": 3, "mm-prefix-fa": 3},
    "vllm-0.26.0": {"mm-prefix-fa": 4},
    "vllm-0.29.0": {"mm-prefix-fa": 4},
    "vllm-0.33.0": {"mm-prefix-fa": 3},
}
FA_MIN_MAJOR = 8  # FlashAttention 2 needs sm_80 or newer
DCP_OPTIONS = ("decode-context-parallel-size", "dcp")
TRUTHY = ("1", "true", "yes", "on")


def _sliding_series_findings(recipe: Recipe, pin_name: str, ctx: CheckContext) -> list[Finding]:
    out = []
    by_name = {s.name: s for s in ctx.series}
    for name, first in SLIDING_FA_SERIES[pin_name].items():
        series = by_name.get(name)
        if series is None:
            out.append(Finding(rule="sliding-fa", severity="warning",
                               message=f"series '{name}' (v{first} or later serves sliding layers on FlashAttention "
                                       f"on {pin_name}) is not in patches/series.yaml's order: not checked",
                               hint="check that the series exists (`g4build patches list`)"))
            continue
        if series.variant(pin_name) is None or series.version < first:
            out.append(Finding(rule="sliding-fa", severity="error",
                               message=f"series '{name}' v{series.version} here has no {pin_name} variant that "
                                       f"serves sliding layers on FlashAttention (needs v{first} or later)",
                               hint="update this checkout's patches/"))
            continue
        if ctx.wheel is None:
            if name in recipe.needs_series:
                continue  # the series rule already says that the stock wheel lacks it
            out.append(Finding(rule="sliding-fa", severity="warning",
                               message=f"sliding layers on FlashAttention need series '{name}' v{first} or later "
                                       f"on {pin_name}: the stock vllm wheel refuses the attention config",
                               hint="install a g4build wheel that carries it; render with --wheel PATH"))
            continue
        carried = ctx.wheel.series.get(name)
        if carried is None or carried < first:
            has = "does not carry it" if carried is None else f"carries v{carried}"
            out.append(Finding(rule="sliding-fa", severity="error",
                               message=f"the wheel {ctx.wheel.file} {has}: sliding layers on FlashAttention need "
                                       f"series '{name}' v{first} or later on {pin_name}",
                               hint="rebuild the wheel with the current series (`g4build wheel` / `g4build overlay`)"))
    return out


def sliding_geometry(recipe: Recipe, ctx: CheckContext) -> tuple[int | None, int | None, str]:
    """(sliding layers, their head dim) and where that came from; None where unknown."""
    kv = None
    basis = "nothing (no --model-dir, no footprint.kv)"
    if ctx.target is not None and ctx.target.kv is not None:
        kv, basis = ctx.target.kv, f"the checkpoint ({ctx.target.path})"
    elif recipe.footprint is not None and recipe.footprint.kv is not None:
        kv, basis = recipe.footprint.kv, "the recipe's footprint.kv"
    if kv is None:
        return None, None, basis
    return kv.sliding_layers, kv.sliding_head_dim or None, basis


def rule_sliding_fa(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    """sliding_attention_backend: flash_attn, valid only where it can work: a pin (and wheel) with per-kind
    backends and the exact mm-prefix recompute, an arch with FlashAttention 2, sliding layers of head dim <= 256,
    no decode context parallel (the recompute cannot be exact there), and on 0.21.0 the V1 runner."""
    if recipe.sliding_attention_backend is None:
        return []
    out: list[Finding] = []
    pin = ctx.pin
    if pin is None:
        out.append(Finding(rule="sliding-fa", severity="warning",
                           message="sliding_attention_backend: no pin known, so the series it needs are not checked",
                           hint="set the recipe's pin or pass --wheel"))
    elif pin.name not in SLIDING_FA_SERIES:
        out.append(Finding(rule="sliding-fa", severity="error",
                           message=f"sliding layers on FlashAttention are not known to work on pin '{pin.name}'",
                           hint="use one of " + ", ".join(SLIDING_FA_SERIES) + " (--set pin=...)"))
    else:
        out += _sliding_series_findings(recipe, pin.name, ctx)
    cap = recipe.hardware.compute_capability
    major = int(cap.split(".")[0])
    if major < FA_MIN_MAJOR:
        out.append(Finding(rule="sliding-fa", severity="error",
                           message=f"{recipe.hardware.arch} (compute capability {cap}) has no FlashAttention 2, "
                                   "which needs sm_80 or newer",
                           hint="--set sliding_attention_backend=null"))
    elif major == 12:
        out.append(Finding(rule="sliding-fa", severity="info",
                           message=f"{recipe.hardware.arch} runs FlashAttention 2 (no FA3, no FA4 there): the sliding "
                                   "layers' image-range rows are recomputed non-causally by FA2"))
    layers, head_dim, basis = sliding_geometry(recipe, ctx)
    if layers == 0:
        out.append(Finding(rule="sliding-fa", severity="warning",
                           message=f"the model has no sliding-window layers (from {basis}): "
                                   "sliding_attention_backend changes nothing",
                           hint="--set sliding_attention_backend=null"))
    elif head_dim is not None and head_dim > FA2_MAX_HEAD_DIM:
        out.append(Finding(rule="sliding-fa", severity="error",
                           message=f"the sliding layers have head dim {head_dim} (from {basis}); FlashAttention "
                                   f"serves head dims up to {FA2_MAX_HEAD_DIM}",
                           hint="--set sliding_attention_backend=null"))
    elif head_dim is None:
        out.append(Finding(rule="sliding-fa", severity="info",
                           message=f"the sliding layers' head dim is not checked: read from {basis}",
                           hint="pass --model-dir (FlashAttention serves head dims up to 256)"))
    for option in DCP_OPTIONS:
        dcp = recipe.args.get(option)
        if isinstance(dcp, int) and not isinstance(dcp, bool) and dcp > 1:
            out.append(Finding(rule="sliding-fa", severity="error",
                               message=f"--{option} {dcp}: with decode context parallel the FlashAttention layers "
                                       "cannot compute image-range rows exactly (vLLM refuses such batches)",
                               hint=f"--set args.{option}=null, or --set sliding_attention_backend=null"))
    backend = recipe.args.get("attention-backend")
    if isinstance(backend, str) and backend.upper() == "FLASH_ATTN":
        out.append(Finding(rule="sliding-fa", severity="error",
                           message="--attention-backend FLASH_ATTN puts every layer on FlashAttention; Gemma 4's "
                                   "full layers (head dim 512) cannot run there",
                           hint="drop it (--set args.attention-backend=null): the other layers keep TRITON_ATTN"))
    v2 = recipe.env.get("VLLM_USE_V2_MODEL_RUNNER", "").strip().lower() in TRUTHY
    if v2 and pin is not None and pin.name == "vllm-0.21.0":
        out.append(Finding(rule="sliding-fa", severity="error",
                           message="VLLM_USE_V2_MODEL_RUNNER on vllm-0.21.0: its V2 runner refuses per-kind "
                                   "backends (its KV cache views of mixed backends are not made block-major)",
                           hint="leave VLLM_USE_V2_MODEL_RUNNER unset (--set env.VLLM_USE_V2_MODEL_RUNNER=0)"))
    return out
