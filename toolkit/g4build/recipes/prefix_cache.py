"""The rule for prefix caching beside a drafter, on pins where a GPU run saw it read nothing back. Pure, like
every rule."""

from __future__ import annotations

from g4build.recipes.findings import CheckContext, Finding
from g4build.recipes.model import Recipe

# Pins on which a prompt sent again read 0 tokens from the prefix cache once a drafter was configured, with DFlash
# and with MTP, while the target alone read its prefix back (tests/gpu/results/vllm-0.29.0-acceptance.json, check
# prefix_cache_hits), and the pin whose run kept the hits. vLLM 0.29.0 counts both drafters as EAGLE-family, so
# every KV group drops the last block of a hit, and its default prefix_cache_retention_interval (0) keeps the
# sliding-window blocks only one block above where that lookup lands; its fallback to dense retention covers
# Mamba hybrids only, not sliding + full attention (Gemma 4). 0.33.0 keeps the block below and skips the drop.
NO_PREFIX_HITS_WITH_A_DRAFTER: dict[str, str] = {"vllm-0.29.0": "vllm-0.33.0"}
RETENTION = "prefix-cache-retention-interval"
FALSE = ("0", "false", "no", "off")
DRAFTER_NAMES = {"dflash": "DFlash", "mtp": "MTP"}


def _caching_off(recipe: Recipe) -> bool:
    on = recipe.args.get("enable-prefix-caching")
    off = recipe.args.get("no-enable-prefix-caching")
    return str(on).lower() in FALSE or (off is not None and str(off).lower() not in FALSE)


def rule_prefix_cache(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    pin = ctx.pin.name if ctx.pin is not None else recipe.pin
    better = NO_PREFIX_HITS_WITH_A_DRAFTER.get(pin or "")
    if recipe.method is None or better is None or _caching_off(recipe):
        return []
    if RETENTION in recipe.args:
        return [Finding(rule="prefix-cache", severity="info",
                        message=f"args.{RETENTION} is set: on {pin} with a drafter the default (0) read nothing "
                                "back from the prefix cache on a GPU; whether this value brings the hits back has "
                                "not run on one",
                        hint=f"pin {better} kept the hits with both drafters")]
    drafter = DRAFTER_NAMES.get(recipe.method, recipe.method)
    return [Finding(rule="prefix-cache", severity="warning",
                    message=f"on {pin} with its {drafter} drafter, a prompt sent again reads nothing from the "
                            "prefix cache (on a GPU: 0 cached tokens with DFlash and with MTP, the target alone "
                            f"read its prefix back): upstream {pin} keeps too few sliding-window blocks for a "
                            "drafter's lookup; outputs are unchanged, every repeat is prefilled again",
                    hint=f"use pin {better} (`g4build overlay --pin {better}`, render with --set pin={better}), "
                         "which kept the hits with both drafters")]
