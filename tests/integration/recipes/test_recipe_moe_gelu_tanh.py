"""`recipe check`'s MoE-backend rule against the pins' own kernels: Gemma 4's MoE uses GELU_TANH, and each release's
NVFP4 MoE oracle maps a --moe-backend value to expert classes whose ``_supports_activation`` may not list it (vLLM
then refuses at start). The rule's per-pin table (moe_backend.GELU_TANH_REJECTED) is exactly what each tree says,
and the rule refuses exactly those values on that pin."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
from tests.support.trees import sdist_tree

from g4build.pins.model import load_pins
from g4build.recipes import load_recipe
from g4build.recipes.moe_backend import GELU_TANH_REJECTED
from g4build.recipes.rules import CheckContext, check
from g4build.series.model import load_all

pytestmark = pytest.mark.network  # the pinned sdists (cached after the first run)

MOE = "vllm/model_executor/layers/fused_moe"


def _oracle(tree: Path) -> dict[str, list[tuple[str, str]]]:
    """--moe-backend value -> (module, class) of the experts it runs, from oracle/nvfp4.py's map_nvfp4_backend and
    backend_to_kernel_cls."""
    body = {n.name: n for n in ast.parse((tree / MOE / "oracle/nvfp4.py").read_text(encoding="utf-8")).body
            if isinstance(n, ast.FunctionDef)}
    options: dict[str, str] = {}
    for node in ast.walk(body["map_nvfp4_backend"]):
        if isinstance(node, ast.Dict):
            options.update({k.value: v.attr for k, v in zip(node.keys, node.values, strict=True)
                            if isinstance(k, ast.Constant) and isinstance(v, ast.Attribute)})
    kernels: dict[str, list[tuple[str, str]]] = {}
    for node in ast.walk(body["backend_to_kernel_cls"]):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            member = node.test.comparators[0]
            assert isinstance(member, ast.Attribute)
            kernels[member.attr] = [(st.module or "", a.name) for st in node.body if isinstance(st, ast.ImportFrom)
                                    for a in st.names]
    return {option: kernels[member] for option, member in options.items()}


def _accepts_gelu_tanh(tree: Path, module: str, cls: str) -> bool | None:
    """Whether ``cls._supports_activation`` lists GELU_TANH (directly, or through apply_moe_activation's set), looking
    through its bases in the same file or the file they are imported from; None where no class defines it."""
    mod = ast.parse((tree / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8"))
    node = next(n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == cls)
    method = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "_supports_activation"), None)
    if method is None:
        for base in node.bases:
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
            where = module if any(isinstance(n, ast.ClassDef) and n.name == name for n in mod.body) else next(
                (n.module for n in mod.body if isinstance(n, ast.ImportFrom) and any(a.name == name for a in n.names)),
                None)
            found = _accepts_gelu_tanh(tree, where, name) if where else None
            if found is not None:
                return found
        return None
    text = ast.unparse(method)
    if "apply_moe_activation_supported" in text:
        act = (tree / MOE / "activation.py").read_text(encoding="utf-8")
        block = act[act.index("_APPLY_MOE_ACTIVATIONS = "):]
        return bool(re.search(r"MoEActivation\.GELU_TANH,", block[: block.index(")\n")]))
    return "GELU_TANH" in text


@pytest.mark.parametrize("pin", sorted(load_pins().pins))
def test_the_rule_refuses_a_kernel_choice_exactly_where_the_kernels_reject_gelu_tanh(pin: str) -> None:
    tree = sdist_tree(pin)
    oracle = _oracle(tree)
    accepted = {option: [_accepts_gelu_tanh(tree, module, cls) for module, cls in classes]
                for option, classes in oracle.items()}
    assert accepted["marlin"] == [True], accepted  # what auto lands on, on every pin
    rejected = tuple(sorted(option for option, found in accepted.items() if False in found))
    assert GELU_TANH_REJECTED[pin] == rejected, (pin, accepted)
    pins = load_pins()
    ctx = CheckContext(pin=pins.get(pin), known_pins=tuple(pins.pins), series=tuple(load_all()))
    for option in oracle:
        recipe = load_recipe("gemma4-26b-a4b-nvfp4-baseline", [f"args.moe-backend={option}"])
        refused = [f for f in check(dataclasses.replace(recipe, pin=pin), ctx) if f.rule == "moe-backend"]
        assert bool(refused) is (option in rejected), (pin, option, refused)
