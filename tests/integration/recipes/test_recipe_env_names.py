"""The env vars a recipe sets, against each pin's own vllm/envs.py (third review, 10): read from the pinned sdists
(sha256-checked, cached), and `recipe check` refusing a name the recipe's pin does not read."""

from __future__ import annotations

import dataclasses

import pytest

from g4build.pins.index import cache_root, fetch_verified
from g4build.pins.model import load_pins
from g4build.recipes import load_recipe, recipe_names
from g4build.recipes.flashinfer import off_switches
from g4build.recipes.rules import CheckContext, check
from g4build.recipes.vllm_envs import pinned_envs
from g4build.series.model import load_all

pytestmark = pytest.mark.network  # the pinned sdists (cached after the first run)

DROPPED = {"VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_TEST_FORCE_FP8_MARLIN", "VLLM_NVFP4_GEMM_BACKEND"}


def _envs(pin_name: str) -> frozenset[str]:
    pin = load_pins().get(pin_name)
    fetch_verified("vllm", pin.sdist.file, pin.sdist.sha256, cache_dir=cache_root() / "sdists")
    envs = pinned_envs(pin)
    assert envs is not None
    return envs


def _env_findings(recipe_name: str, pin_name: str) -> list[tuple[str, str]]:
    pins = load_pins()
    recipe = dataclasses.replace(load_recipe(recipe_name), pin=pin_name)
    ctx = CheckContext(pin=pins.get(pin_name), known_pins=tuple(pins.pins), series=tuple(load_all()),
                       vllm_envs=_envs(pin_name))
    return [(f.severity, f.message) for f in check(recipe, ctx) if f.rule == "env-names"]


def test_the_pins_own_envs() -> None:
    assert _envs("vllm-0.21.0") >= DROPPED
    for pin in ("vllm-0.29.0", "vllm-0.33.0"):
        assert not DROPPED & _envs(pin), pin
        assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in _envs(pin)


@pytest.mark.parametrize("name", recipe_names())
def test_shipped_recipes_set_only_what_their_pin_reads(name: str) -> None:
    recipe = load_recipe(name)
    assert _env_findings(name, recipe.pin) == []


def test_a_recipe_moved_to_a_pin_that_dropped_its_variables_is_refused() -> None:
    recipe = load_recipe("gemma4-26b-a4b-nvfp4-dflash")
    dropped = sorted(DROPPED & set(recipe.env))
    assert dropped  # the recipe sets at least one of them (0.21.0 reads them)
    found = _env_findings("gemma4-26b-a4b-nvfp4-dflash", "vllm-0.33.0")
    assert [s for s, _ in found] == ["error"] * len(dropped)
    assert all(any(name in message for _, message in found) for name in dropped)


@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"])
def test_the_no_flashinfer_fallback_sets_only_names_the_pin_reads(pin: str) -> None:
    """The launch scripts' fallback turns off only what the recipe's env opens (plus the sampler, read by every
    pin), so a recipe that passes the rule on a pin gets a fallback of names that pin reads."""
    envs = _envs(pin)
    for name in recipe_names():
        env = {k: v for k, v in load_recipe(name).env.items() if not k.startswith("VLLM_") or k in envs}
        assert {s.name for s in off_switches(env)} <= envs, (pin, name)


def _ctx(pin_name: str) -> CheckContext:
    pins = load_pins()
    return CheckContext(pin=pins.get(pin_name), known_pins=tuple(pins.pins), series=tuple(load_all()),
                        vllm_envs=_envs(pin_name))


def test_rendering_for_a_pin_leaves_out_the_recipes_own_variables_it_does_not_read() -> None:
    from g4build.recipes.env_names import fit_env_to_pin, user_env_names

    recipe = dataclasses.replace(load_recipe("gemma4-26b-a4b-nvfp4-dflash"), pin="vllm-0.33.0")
    ctx = _ctx("vllm-0.33.0")
    fitted, notes = fit_env_to_pin(recipe, ctx)
    dropped = sorted(DROPPED & set(recipe.env))
    assert not DROPPED & set(fitted.env) and set(recipe.env) - set(fitted.env) == set(dropped)
    assert [f.severity for f in notes] == ["warning"] * len(dropped)
    assert [f for f in check(fitted, ctx) if f.rule == "env-names"] == []
    # a name the user asked for by hand stays, and is refused
    user = user_env_names(["env.VLLM_TEST_FORCE_FP8_MARLIN=0", "args.max-num-seqs=4"])
    assert user == {"VLLM_TEST_FORCE_FP8_MARLIN"}
    kept, _ = fit_env_to_pin(recipe, ctx, user)
    assert "VLLM_TEST_FORCE_FP8_MARLIN" in kept.env
    assert [f.severity for f in check(kept, ctx) if f.rule == "env-names"] == ["error"]
    # on the pin that reads them nothing is left out
    same, none = fit_env_to_pin(load_recipe("gemma4-26b-a4b-nvfp4-dflash"), _ctx("vllm-0.21.0"))
    assert none == [] and same.env == load_recipe("gemma4-26b-a4b-nvfp4-dflash").env
