"""The rule for prefix caching beside a drafter, on pins where a GPU run saw it read nothing back, and the retention
setting rendering applies there (``fit_retention_to_pin``). Pure, like every rule."""

from __future__ import annotations

import dataclasses

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
# The retention rendering sets on those pins (per-pin recipe data): "None" is dense retention, a sliding-window
# checkpoint at every scheduler block (single_type_kv_cache_manager.reachable_block_mask: segment = the alignment),
# the same checkpoints as an interval equal to the scheduler's block size, which a CPU replay of 0.29.0's KV cache
# manager found to bring the hits back (a block or two short, as on 0.26.0; test_recipe_prefix_retention.py replays
# it). Dense needs no block size: 0.29.0's scheduler block size is the lcm of its KV groups' block sizes after
# page-size unification (model and drafter geometry), and an interval not a multiple of it stops the engine at start.
# It is what 0.29.0 itself picks for Mamba hybrids with an EAGLE drafter; its command line reads "None" as None.
RETENTION_FOR_DRAFTERS: dict[str, str] = {"vllm-0.29.0": "None"}
GPU_CHECK = "tests/gpu/e2e/README.md, '0.29.0 prefix retention'"  # the run that would prove it, not yet run
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


def _pin(recipe: Recipe, ctx: CheckContext) -> str | None:
    wheel_pin = ctx.wheel.pin if ctx.wheel is not None else None
    return wheel_pin or (ctx.pin.name if ctx.pin is not None else recipe.pin)


def _misses(recipe: Recipe, ctx: CheckContext, pin: str | None) -> bool:
    """A pin whose default read nothing back, an EAGLE-family drafter, caching on, sliding-window layers."""
    return (pin in NO_PREFIX_HITS_WITH_A_DRAFTER and recipe.method in DRAFTERS and not _caching_off(recipe)
            and _has_sliding_layers(recipe, ctx))


def fit_retention_to_pin(recipe: Recipe, ctx: CheckContext) -> Recipe:
    """The recipe with the pin's retention (RETENTION_FOR_DRAFTERS) where its default read nothing back, unless the
    recipe (or the user's --set) names a retention itself, or the pin's argument table lacks the option."""
    pin = _pin(recipe, ctx)
    value = RETENTION_FOR_DRAFTERS.get(pin or "")
    if value is None or not _misses(recipe, ctx, pin) or RETENTION_ARG in recipe.args or RETENTION_ENV in recipe.env:
        return recipe
    if ctx.vllm_options is not None and RETENTION_ARG not in ctx.vllm_options:
        return recipe
    return dataclasses.replace(recipe, args={**recipe.args, RETENTION_ARG: value})


def rule_prefix_cache(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    pin = _pin(recipe, ctx)
    if not _misses(recipe, ctx, pin):
        return []
    kept = NO_PREFIX_HITS_WITH_A_DRAFTER[pin or ""]
    drafter = DRAFTERS[recipe.method or ""]
    use = (f"use pin {kept[0]} on WSL/Linux (`g4build overlay --pin {kept[0]}`, render with --set pin={kept[0]}) "
           f"or {kept[1]} for the Windows fork's wheel; both kept the hits with DFlash and MTP")
    retention = _retention(recipe)
    if retention is not None and retention[1] == RETENTION_FOR_DRAFTERS.get(pin or ""):
        where, value = retention
        return [Finding(rule="prefix-cache", severity="warning",
                        message=f"on {pin} with {drafter} drafter the default retention (0) read nothing back from "
                                f"the prefix cache on a GPU; {where} is {value} (dense retention: a sliding-window "
                                "checkpoint at every scheduler block), applied for this pin, which a CPU replay of "
                                f"{pin}'s KV cache manager shows reading the hits back (a block or two short); "
                                f"unproven on a GPU until that run exists ({GPU_CHECK})",
                        hint=f"check a repeated prompt's cached tokens (vLLM's /metrics prefix cache hits), or {use}")]
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
