"""The recipe rules: pure functions from (recipe, what we know) to findings.

Each rule returns findings of severity ``error`` (the script would fail or misbehave: rendering refuses),
``warning`` (likely trouble: said before the user waits minutes for it) or ``info`` (what was assumed).
Nothing here reads files or imports vLLM; the CLI gathers the context at the edge (``context.py``).
"""

from __future__ import annotations

from g4build.recipes.cards import rule_card
from g4build.recipes.counts import int_arg
from g4build.recipes.draft_groups import rule_draft_groups
from g4build.recipes.env_names import rule_env_allowed, rule_env_names
from g4build.recipes.fa_kv_dtype import rule_fa_kv_dtype
from g4build.recipes.findings import (
    FA2_MAX_HEAD_DIM,
    CheckContext,
    Finding,
    Rule,
    Severity,
    WheelInfo,
    is_gemma4,
)
from g4build.recipes.flashinfer import FlashInferInfo, fixed_paths, off_switches
from g4build.recipes.mm_batched import rule_mm_batched
from g4build.recipes.model import MAX_COUNT, Recipe
from g4build.recipes.moe_backend import rule_moe_backend
from g4build.recipes.prefix_cache import rule_prefix_cache
from g4build.recipes.sliding_fa import rule_sliding_fa
from g4build.recipes.vram import rule_vram
from g4build.series.model import Series, unmet_requirements

__all__ = ["RULES", "CheckContext", "Finding", "Rule", "Severity", "WheelInfo", "check", "errors"]

MAX_SPEC_TOKENS = 16  # DFlash drafters verify blocks of 16 (15 drafted); MTP uses a handful


def _is_modelopt_nvfp4(recipe: Recipe, ctx: CheckContext) -> bool:
    if ctx.target is not None:
        return ctx.target.is_modelopt_nvfp4
    cp = recipe.checkpoint
    return (cp.quant_method or "").lower() == "modelopt" and "NVFP4" in (cp.quant_algo or "").upper()


def rule_pin(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    out = []
    if recipe.pin is not None and ctx.known_pins and recipe.pin not in ctx.known_pins:
        out.append(Finding(rule="pin", severity="error",
                           message=f"pin '{recipe.pin}' is not in patches/pins.yaml "
                                   f"(expected one of {', '.join(ctx.known_pins)})",
                           hint="fix the recipe's pin or run `g4build pins list`"))
    if ctx.wheel is not None and recipe.pin and ctx.wheel.pin and ctx.wheel.pin != recipe.pin:
        # an error, not a warning: the script would demand the other pin's torch and transformers, which this
        # wheel cannot run with, and stop at launch
        out.append(Finding(rule="pin", severity="error",
                           message=f"the wheel {ctx.wheel.file} was built from pin '{ctx.wheel.pin}' (its "
                                   f"build-manifest.json), but the recipe is rendered for pin '{recipe.pin}'",
                           hint=f"leave --set pin out (the pin then follows the wheel), or --set pin={ctx.wheel.pin}"))
    if ctx.wheel is not None and ctx.wheel.series and not (ctx.wheel.pin and ctx.wheel.pin in ctx.known_pins):
        # as validate: a series is known by its fingerprints for one pin; a claim without a known pin is no claim
        which = f"an unknown pin {ctx.wheel.pin!r}" if ctx.wheel.pin else "no pin"
        out.append(Finding(rule="pin", severity="error",
                           message=f"the wheel {ctx.wheel.file} claims series {', '.join(sorted(ctx.wheel.series))} "
                                   f"but its build-manifest.json names {which}: what it carries cannot be checked",
                           hint="rebuild or re-overlay the wheel for a pin of patches/pins.yaml; `g4build validate "
                                "WHEEL` says the same"))
    return out


def rule_quantization(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    forced = recipe.args.get("quantization")
    if not (isinstance(forced, str) and forced.lower().startswith("modelopt")):
        return []
    if not _is_modelopt_nvfp4(recipe, ctx):
        return []
    return [Finding(rule="quantization", severity="error",
                    message=f"--quantization {forced} is forced for a modelopt NVFP4 checkpoint: vLLM detects "
                            "the checkpoint's quantization itself, and forcing it breaks the drafter path",
                    hint="remove it (--set args.quantization=null)")]


def rule_dflash_backend(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    if recipe.method != "dflash" or recipe.speculative is None:
        return []
    out = []
    backend = recipe.speculative.get("attention_backend")
    if str(backend or "").lower() != "flash_attn":
        found = "unset (vLLM then picks a causal-only backend)" if backend is None else repr(backend)
        out.append(Finding(rule="dflash-backend", severity="error",
                           message=f"a DFlash drafter attends non-causally within its block and needs the "
                                   f"flash_attn backend; speculative.attention_backend is {found}",
                           hint="--set speculative.attention_backend=flash_attn"))
    if ctx.drafter is not None:
        dims = [d for d in (ctx.drafter.head_dim, ctx.drafter.global_head_dim) if d]
        if dims and max(dims) > FA2_MAX_HEAD_DIM:
            out.append(Finding(rule="dflash-backend", severity="error",
                               message=f"the drafter ({ctx.drafter.path}) has head dim {max(dims)}; FlashAttention 2 "
                                       f"(what SM120 runs) serves head dims up to {FA2_MAX_HEAD_DIM}",
                               hint="use a drafter with head_dim <= 256"))
    if not recipe.needs_series:
        out.append(Finding(rule="dflash-backend", severity="warning",
                           message="the recipe names no series (needs_series), so g4build cannot tell whether "
                                   f"pin '{recipe.pin}' has the DFlash fixes or needs a g4build wheel",
                           hint="list the series the DFlash path needs in needs_series"))
    return out


def _series_finding(recipe: Recipe, ctx: CheckContext, name: str, by_name: dict[str, Series]) -> Finding | None:
    pin = ctx.pin
    series = by_name.get(name)
    if series is None:
        return Finding(rule="series", severity="warning",
                       message=f"series '{name}' (needs_series) is not in patches/series.yaml's order, so g4build "
                               "cannot tell whether the pin needs it or the wheel carries it",
                       hint="check that the series exists (`g4build patches list`) and is spelled right")
    if pin is None:
        return None
    if series.upstream_in(pin.version):
        return None
    variant = series.variant(pin.name)
    if variant is None:
        return Finding(rule="series", severity="error",
                       message=f"series '{name}' has no patches for pin '{pin.name}' and upstream {pin.version} "
                               "lacks the fix: no wheel for this pin can carry it",
                       hint="use a pin the series supports: " + (", ".join(sorted(series.pins)) or "none yet"))
    if not variant.patches:
        return None  # the pin needs nothing: upstream has the fix there
    if ctx.wheel is None:
        return Finding(rule="series", severity="warning",
                       message=f"pin '{pin.name}' lacks the upstream fix that series '{name}' carries: the stock "
                               "vllm wheel will fail; install a g4build wheel that carries it",
                       hint=f"overlay one in seconds (`g4build overlay --pin {pin.name}`) or build one "
                            "(`g4build wheel`), then render with --wheel PATH")
    carried = ctx.wheel.series.get(name)
    if carried is None:
        return Finding(rule="series", severity="error",
                       message=f"the wheel {ctx.wheel.file} does not carry series '{name}', which pin "
                               f"'{pin.name}' needs (it carries: {', '.join(ctx.wheel.series) or 'none'})",
                       hint="rebuild the wheel with the series applied (`g4build wheel`)")
    if carried < series.version:
        return Finding(rule="series", severity="warning",
                       message=f"the wheel {ctx.wheel.file} carries series '{name}' version {carried}; "
                               f"version {series.version} is current",
                       hint="rebuild the wheel to pick up the newer series")
    return None


def rule_series(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    by_name = {s.name: s for s in ctx.series}
    found = (_series_finding(recipe, ctx, name, by_name) for name in recipe.needs_series)
    return [f for f in found if f is not None] + _unmet_requires(recipe, ctx, by_name)


def _unmet_requires(recipe: Recipe, ctx: CheckContext, by_name: dict[str, Series]) -> list[Finding]:
    """A series the recipe needs may be correct only together with another (series.yaml ``requires``)."""
    if ctx.pin is None:
        return []
    chosen = [by_name[n] for n in recipe.needs_series if n in by_name]
    return [Finding(rule="series", severity="error",
                    message=f"series '{name}' on {ctx.pin.name} is correct only with series '{req}' (its series.yaml "
                            "requires it), which needs_series leaves out",
                    hint=f"add {req} to needs_series")
            for name, req in unmet_requirements(chosen, ctx.series, ctx.pin.name)]


def rule_mtp_transformers(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    if recipe.method != "mtp" or not is_gemma4(recipe, ctx):
        return []
    out = []
    if ctx.drafter is not None and ctx.drafter.model_type != "gemma4_assistant":
        out.append(Finding(rule="mtp-transformers", severity="warning",
                           message=f"the MTP drafter's config.json has model_type '{ctx.drafter.model_type}', "
                                   "expected 'gemma4_assistant'",
                           hint="point speculative.model at the Gemma 4 assistant checkpoint"))
    known = ctx.transformers_model_types
    if not ctx.transformers_asked:
        out.append(Finding(rule="mtp-transformers", severity="info",
                           message="the Gemma 4 MTP drafter needs a transformers that knows 'gemma4_assistant'; "
                                   "not checked here", hint="run `g4build recipe check` in the serving environment"))
    elif known is None:
        out.append(Finding(rule="mtp-transformers", severity="warning",
                           message="the Gemma 4 MTP drafter needs a transformers that knows model type "
                                   "'gemma4_assistant'; no transformers is importable here to check",
                           hint="run `g4build recipe check` in the environment that serves, or upgrade transformers"))
    elif "gemma4_assistant" not in known:
        out.append(Finding(rule="mtp-transformers", severity="warning",
                           message="the installed transformers does not know model type 'gemma4_assistant', "
                                   "which the Gemma 4 MTP drafter needs",
                           hint="pip install --upgrade transformers"))
    return out


def rule_spec_tokens(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    if recipe.speculative is None:
        return []
    n = recipe.speculative.get("num_speculative_tokens")
    if n is None:
        return [Finding(rule="spec-tokens", severity="warning",
                        message="speculative.num_speculative_tokens is not set; vLLM falls back to the drafter's "
                                "default, which may not be what was measured",
                        hint="set it, e.g. 15 for DFlash, 4 for the Gemma 4 MTP assistant")]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return [Finding(rule="spec-tokens", severity="error",
                        message=f"speculative.num_speculative_tokens must be a whole number >= 1, found {n!r}",
                        hint="--set speculative.num_speculative_tokens=15")]
    if n > MAX_SPEC_TOKENS:
        return [Finding(rule="spec-tokens", severity="warning",
                        message=f"speculative.num_speculative_tokens={n} is above {MAX_SPEC_TOKENS}: drafts that "
                                "long are mostly rejected and cost verification time",
                        hint=f"use {MAX_SPEC_TOKENS - 1} or fewer")]
    return []


COUNT_OPTIONS = ("max-model-len", "max-num-seqs", "max-num-batched-tokens")  # what the rules compute with


def rule_counts(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    out = []
    for option in COUNT_OPTIONS:
        value = recipe.args.get(option)
        if isinstance(value, int) and not isinstance(value, bool) and not 1 <= value <= MAX_COUNT:
            out.append(Finding(rule="counts", severity="error",
                               message=f"{option} must be a whole number from 1 to {MAX_COUNT}, found {value}",
                               hint=f"--set args.{option}=N with a count vLLM can serve"))
    return out


def rule_batched_tokens(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    max_len = int_arg(recipe, "max-model-len")
    batched = int_arg(recipe, "max-num-batched-tokens")
    if max_len is None or batched is None or batched >= max_len:
        return []
    chunked = recipe.args.get("enable-chunked-prefill")
    if chunked is False:
        return [Finding(rule="batched-tokens", severity="error",
                        message=f"max-num-batched-tokens ({batched}) < max-model-len ({max_len}) with chunked "
                                "prefill off: a long prompt can never be scheduled",
                        hint=f"raise max-num-batched-tokens to {max_len} or enable chunked prefill")]
    if chunked is None:
        return [Finding(rule="batched-tokens", severity="info",
                        message=f"max-num-batched-tokens ({batched}) < max-model-len ({max_len}) relies on vLLM's "
                                "default of chunked prefill on",
                        hint="say enable-chunked-prefill: true to be explicit")]
    return []


def flashinfer_presence(ctx: CheckContext) -> FlashInferInfo:
    if ctx.wheel is not None and ctx.wheel.flashinfer is not None:
        return ctx.wheel.flashinfer
    return FlashInferInfo(presence="unknown", why="no --wheel to read")


def rule_flashinfer(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    """Without FlashInfer the launch turns its switches off (statically for a wheel known to lack it, else by a
    check at start); a backend named flashinfer cannot be turned off, so that is an error where it is absent."""
    info = flashinfer_presence(ctx)
    switches = off_switches(recipe.env, recipe.args)
    changes = ", ".join(s.label for s in switches)
    wheel = ctx.wheel.file if ctx.wheel is not None else ""
    if info.presence == "absent":
        out = [Finding(rule="flashinfer", severity="error",
                       message=f"{where} {value} needs FlashInfer, which {wheel} does not bring ({info.why})",
                       hint=f"{fix}, or build with Windows FlashInfer wheels (g4build wheel --flashinfer-wheel)")
               for where, value, fix in fixed_paths(recipe)]
        if switches:
            out.append(Finding(rule="flashinfer", severity="info",
                               message=f"FlashInfer: absent from {wheel} ({info.why}); the launch script sets "
                                       f"{changes} (" + "; ".join(s.why for s in switches) + ")"))
        return out
    where = f"{wheel} ({info.why})" if info.presence == "present" else "the serving environment (not known here)"
    if not switches:
        return [Finding(rule="flashinfer", severity="info", message=f"FlashInfer: {info.presence}; the recipe "
                        "opens no FlashInfer path that an environment variable or option closes")]
    return [Finding(rule="flashinfer", severity="info",
                    message=f"FlashInfer: {info.presence} in {where}; the launch script checks at start that "
                            f"flashinfer is importable and, where it is not, sets {changes}")]


MM_CACHE_TEXT_ONLY = ("0.21.0",)  # found on a GPU run: tests/gpu/e2e/README.md


def rule_mm_processor_cache(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    """vLLM 0.21.0's multimodal processor cache runs Gemma 4's HF processor on the prompt text alone, also while
    profiling at engine start; transformers 5.17's Gemma4Processor refuses image tokens without images."""
    if ctx.pin is None or ctx.pin.version not in MM_CACHE_TEXT_ONLY or not is_gemma4(recipe, ctx):
        return []
    value = recipe.args.get("mm-processor-cache-gb")
    if value == 0 and not isinstance(value, bool):
        return []
    return [Finding(rule="mm-processor-cache", severity="warning",
                    message=f"vLLM {ctx.pin.version}'s multimodal processor cache runs Gemma 4's processor on the "
                            "text alone, which transformers 5.17+ refuses (engine start fails); "
                            f"mm-processor-cache-gb is {'unset' if value is None else repr(value)}",
                    hint="--set args.mm-processor-cache-gb=0")]


RULES: tuple[Rule, ...] = (
    rule_card,
    rule_pin,
    rule_quantization,
    rule_moe_backend,
    rule_dflash_backend,
    rule_draft_groups,
    rule_series,
    rule_mtp_transformers,
    rule_spec_tokens,
    rule_counts,
    rule_batched_tokens,
    rule_mm_batched,
    rule_flashinfer,
    rule_env_allowed,
    rule_env_names,
    rule_mm_processor_cache,
    rule_vram,
    rule_fa_kv_dtype,
    rule_sliding_fa,
    rule_prefix_cache,
)


def check(recipe: Recipe, ctx: CheckContext) -> tuple[Finding, ...]:
    return tuple(f for rule in RULES for f in rule(recipe, ctx))


def errors(findings: tuple[Finding, ...]) -> tuple[Finding, ...]:
    return tuple(f for f in findings if f.severity == "error")
