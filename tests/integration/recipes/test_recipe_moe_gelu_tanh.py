"""`recipe check`'s MoE-backend rule against the pins' own kernels: Gemma 4's MoE uses GELU_TANH, which 0.21.0's
CUTLASS and FlashInfer NVFP4 MoE experts reject (auto lands on Marlin) and later releases' accept. The rule refuses
--moe-backend cutlass / flashinfer_* exactly on the pins whose trees reject it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from tests.support.trees import sdist_tree

from g4build.pins.model import load_pins
from g4build.recipes import load_recipe
from g4build.recipes.rules import CheckContext, check
from g4build.series.model import load_all

pytestmark = pytest.mark.network  # the pinned sdists (cached after the first run)

EXPERTS = "vllm/model_executor/layers/fused_moe/experts"
KERNELS = {"cutlass_moe.py": "CutlassExpertsFp4", "flashinfer_cutlass_moe.py": "FlashInferExperts"}


def _accepts_gelu_tanh(tree: Path, file: str, cls: str) -> bool:
    """Whether ``cls._supports_activation`` in the tree lists GELU_TANH (directly, or through the generic
    apply_moe_activation's set)."""
    text = (tree / EXPERTS / file).read_text(encoding="utf-8")
    body = text[text.index(f"class {cls}("):]
    body = body[body.index("def _supports_activation"):]
    body = body[: body.index("\n    @", 1)] if "\n    @" in body[1:] else body
    if "apply_moe_activation_supported" in body:
        act = (tree / "vllm/model_executor/layers/fused_moe/activation.py").read_text(encoding="utf-8")
        block = act[act.index("_APPLY_MOE_ACTIVATIONS = "):]
        return bool(re.search(r"MoEActivation\.GELU_TANH,", block[: block.index(")\n")]))
    return "MoEActivation.GELU_TANH," in body


@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"])
def test_the_rule_refuses_a_kernel_choice_exactly_where_the_kernels_reject_gelu_tanh(pin: str) -> None:
    tree = sdist_tree(pin)
    accepted = {file: _accepts_gelu_tanh(tree, file, cls) for file, cls in KERNELS.items()}
    assert len(set(accepted.values())) == 1, accepted  # both kernels agree on every pin
    pins = load_pins()
    recipe = load_recipe("gemma4-26b-a4b-nvfp4-baseline", ["args.moe-backend=flashinfer_cutlass"])
    ctx = CheckContext(pin=pins.get(pin), known_pins=tuple(pins.pins), series=tuple(load_all()))
    refused = [f for f in check(dataclasses.replace(recipe, pin=pin), ctx) if f.rule == "moe-backend"]
    assert bool(refused) is not accepted["cutlass_moe.py"], (pin, accepted, refused)
