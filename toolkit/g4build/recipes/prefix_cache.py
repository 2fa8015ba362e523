"""The rule for prefix caching beside a drafter, on pins where a GPU run saw it read nothing back. Pure, like
every rule."""

from __future__ import annotations

from g4build.recipes.findings import CheckContext, Finding, is_gemma4
from g4build.recipes.model import Recipe
from g4build.recipes.sliding_fa import sliding_geometry

# Pins on which a prompt sent again read 0 tokens from the prefix cache once a drafter was configured, with DFlash
# and with MTP, while the target alone read its prefix back (tests/gpu/results/vllm-0.29.0-acceptance.json, check
# prefix_cache_hits), and the pins whose runs kept the hits (the first for WSL/Linux, the second for the Windows
# fork's wheels). vLLM 0.29.0 treats EAGLE-family drafters (eagle, eagle3, mtp, dflash, dspark: its use_eagle())
# as needing the last block of a hit dropped in every KV group, and its default prefix_cache_retention_interval
# (0) keeps a sliding-window group's blocks only at the prompt's end, one block above where that shortened lookup
# lands; the groups must agree, so the hit is 0. Its fallback to dense retention covers Mamba hybrids only. A
# model without sliding-window layers has no such group. 0.33.0 keeps the block below and skips the drop.
NO_PREFIX_HITS_WITH_A_DRAFTER: dict[str, tuple[str, ...]] = {"vllm-0.29.0": ("vllm-0.33.0", "vllm-0.26.0")}
RETENTION_ARG = "prefix-cache-retention-interval"
RETENTION_ENV = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"  # deprecated in 0.29.0, still read there
FALSE = ("0", "false", "no", "off")
# vLLM 0.29.0's EAGLE family (its use_eagle()), as a message names each
DRAFTERS = {"dflash": "a DFlash", "mtp": "an MTP", "eagle": "an EAGLE", "eagle3": "an EAGLE-3", "dspark": "a DSpark"}


def _caching_off(recipe: Recipe) -> bool:
    on = recipe.args.get("enable-prefix-caching")
    off = recipe.args.get("no-enable-prefix-caching")
    return str(on).lower() in FALSE or (off is not None and str(off).lower() not in FALSE)


def _has_sliding_layers(recipe: Recipe, ctx: CheckContext) -> bool:
    """Sliding-window layers, from the checkpoint or the recipe's footprint; a Gemma 4 target by name else."""
    layers, _, _ = sliding_geometry(recipe, ctx)
    return layers > 0 if layers is not None else is_gemma4(recipe, ctx)


def _retention(recipe: Recipe) -> tuple[str, str] | None:
    """Where a retention interval other than the failing default 0 is set, and to what."""
    for where, value in ((f"args.{RETENTION_ARG}", recipe.args.get(RETENTION_ARG)),
                         (f"env.{RETENTION_ENV}", recipe.env.get(RETENTION_ENV))):
        if value is not None and str(value).strip() not in ("0", ""):
            return where, str(value)
    return None


def rule_prefix_cache(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    wheel_pin = ctx.wheel.pin if ctx.wheel is not None else None
    pin = wheel_pin or (ctx.pin.name if ctx.pin is not None else recipe.pin)
    kept = NO_PREFIX_HITS_WITH_A_DRAFTER.get(pin or "")
    method = recipe.method
    if kept is None or method not in DRAFTERS or _caching_off(recipe) or not _has_sliding_layers(recipe, ctx):
        return []
    drafter = DRAFTERS[method]
    use = (f"use pin {kept[0]} on WSL/Linux (`g4build overlay --pin {kept[0]}`, render with --set pin={kept[0]}) "
           f"or {kept[1]} for the Windows fork's wheel; both kept the hits with DFlash and MTP")
    retention = _retention(recipe)
    if retention is not None:
        where, value = retention
        return [Finding(rule="prefix-cache", severity="warning",
                        message=f"on {pin} with {drafter} drafter the default retention (0) read nothing back "
                                f"from the prefix cache on a GPU; {where} is {value}, which has not run on one, so "
                                "whether repeats hit the cache is unknown",
                        hint=f"check a repeated prompt's cached tokens (vLLM's /metrics prefix cache hits), or {use}")]
    return [Finding(rule="prefix-cache", severity="warning",
                    message=f"on {pin} with {drafter} drafter, prefix caching (on by default) reads nothing back: "
                            "on a GPU a prompt sent again got 0 cached tokens with DFlash and with MTP while the "
                            f"target alone read its prefix back. Upstream {pin} keeps a sliding-window layer's "
                            "blocks one block above where a drafter's shortened lookup lands; outputs are "
                            "unchanged, every repeat is prefilled again",
                    hint=use)]
