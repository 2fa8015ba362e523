"""The rule for the MoE kernel a recipe forces on Gemma 4, whose experts use GELU_TANH: a kernel whose experts do not
list GELU_TANH in ``_supports_activation`` makes vLLM refuse at start, so ``recipe check`` refuses it first. Which
``--moe-backend`` values those are differs per release; the table below is read from each pin's own source (its
NVFP4 MoE oracle's backend -> expert classes, and their ``_supports_activation``), and a test keeps it equal to the
pins' trees (tests/integration/recipes/test_recipe_moe_gelu_tanh.py). Pure, like every rule."""

from __future__ import annotations

from typing import Any

from g4build.recipes.findings import CheckContext, Finding, is_gemma4
from g4build.recipes.model import Recipe
from g4build.recipes.vllm_choices import LOWER_UNDERSCORE, normalized

# pin -> the --moe-backend values whose NVFP4 MoE experts reject GELU_TANH. No pin is judged as the default pin.
GELU_TANH_REJECTED: dict[str, tuple[str, ...]] = {
    "vllm-0.21.0": ("cutlass", "flashinfer_cutedsl", "flashinfer_cutlass", "flashinfer_trtllm"),
    "vllm-0.26.0": ("flashinfer_b12x", "flashinfer_cutedsl"),
    "vllm-0.29.0": ("b12x", "flashinfer_cutedsl"),
    "vllm-0.33.0": ("b12x", "flashinfer_cutedsl", "flashinfer_moe_ep_cutedsl"),
}
DEFAULT_PIN = "vllm-0.21.0"
FLASHINFER_MOE_FP4 = "VLLM_USE_FLASHINFER_MOE_FP4"  # 0.21.0's switch to FlashInfer's NVFP4 MoE (dropped in 0.26.0)


def _rejects(pin: str, value: Any) -> bool:
    """As vLLM reads the value (its parser lower-cases it and turns ``-`` into ``_``: ``flashinfer-cutedsl`` is
    ``flashinfer_cutedsl``)."""
    return (isinstance(value, str)
            and normalized(value.strip(), LOWER_UNDERSCORE) in GELU_TANH_REJECTED.get(pin, ()))


def rule_moe_backend(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    pin = ctx.pin.name if ctx.pin is not None else DEFAULT_PIN
    if not is_gemma4(recipe, ctx) or pin not in GELU_TANH_REJECTED:
        return []
    why = (f"Gemma 4's MoE uses GELU_TANH, which that MoE kernel rejects on {pin} (vLLM refuses at start; there it "
           f"rejects {', '.join(GELU_TANH_REJECTED[pin])})")
    places = [("--moe-backend", recipe.args.get("moe-backend"), "--set args.moe-backend=null")]
    if recipe.speculative:
        places.append(("speculative moe_backend", recipe.speculative.get("moe_backend"),
                       "--set speculative.moe_backend=null"))
    out = [Finding(rule="moe-backend", severity="error", message=f"{where} {value}: {why}",
                   hint=f"leave the MoE backend on auto (it lands on a kernel that accepts it), or name one the pin "
                        f"accepts (marlin): {fix}")
           for where, value, fix in places if _rejects(pin, value)]
    flag = recipe.env.get(FLASHINFER_MOE_FP4, "").strip().lower()
    if pin == DEFAULT_PIN and flag in ("1", "true", "yes", "on"):
        out.append(Finding(rule="moe-backend", severity="error",
                           message=f"{FLASHINFER_MOE_FP4}={recipe.env[FLASHINFER_MOE_FP4]}: Gemma 4's MoE uses "
                                   "GELU_TANH, which the FlashInfer NVFP4 MoE kernels of vllm-0.21.0 reject",
                           hint=f"set it to 0 (--set env.{FLASHINFER_MOE_FP4}=0)"))
    return out
