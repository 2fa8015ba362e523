"""The rule for an fp8 KV cache beside FlashAttention layers: FlashAttention serves an fp8 KV cache only as FA3, which
runs on SM90 alone; elsewhere (SM120 has FA2 only) vLLM's FlashAttention refuses it when the layers are built, so a
DFlash drafter (FlashAttention) or sliding layers on FlashAttention stop the server at start. Pure, like every rule."""

from __future__ import annotations

from g4build.recipes.findings import CheckContext, Finding
from g4build.recipes.model import Recipe

FP8_FA_ARCH = "9.0"  # FA3: the only FlashAttention with an fp8 KV cache


def flash_attention_layers(recipe: Recipe) -> list[str]:
    """What in this recipe runs FlashAttention (the layers that would refuse an fp8 KV cache)."""
    out = []
    if recipe.method == "dflash" and str((recipe.speculative or {}).get("attention_backend") or "") == "flash_attn":
        out.append("the DFlash drafter (speculative.attention_backend flash_attn)")
    if recipe.sliding_attention_backend == "flash_attn":
        out.append("the sliding layers (sliding_attention_backend flash_attn)")
    return out


def fp8_kv_refused(recipe: Recipe) -> bool:
    """Whether an fp8 KV cache would be refused on the recipe's card (FlashAttention layers, not SM90)."""
    return bool(flash_attention_layers(recipe)) and recipe.hardware.compute_capability != FP8_FA_ARCH


def rule_fa_kv_dtype(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    dtype = str(recipe.args.get("kv-cache-dtype") or "auto")
    if not dtype.startswith("fp8") or not fp8_kv_refused(recipe):
        return []
    layers = " and ".join(flash_attention_layers(recipe))
    return [Finding(rule="kv-cache-dtype", severity="error",
                    message=f"kv-cache-dtype {dtype} on {recipe.hardware.arch}: {layers} run FlashAttention, which "
                            f"serves an fp8 KV cache only as FA3 (SM90); FlashAttention 2 refuses it at start",
                    hint="leave kv-cache-dtype at auto, or run those layers on another backend")]
