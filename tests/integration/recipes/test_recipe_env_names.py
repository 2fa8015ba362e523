"""The env vars a recipe sets, against each pin's own vllm/envs.py (third review, 10): read from the pinned sdists
(sha256-checked, cached), and `recipe check` refusing a name the recipe's pin does not read."""

from __future__ import annotations

import ast
import dataclasses
import tarfile

import pytest

from g4build.errors import RecipeError
from g4build.pins.index import cache_root, fetch_verified
from g4build.pins.model import load_pins
from g4build.recipes import load_recipe, recipe_names
from g4build.recipes.argv import serve_argv
from g4build.recipes.env_names import fit_env_to_pin
from g4build.recipes.flashinfer import FlashInferInfo, off_switches
from g4build.recipes.renamed_env import load_renamed
from g4build.recipes.rules import CheckContext, check
from g4build.recipes.script import plan_launch
from g4build.recipes.vllm_args import recorded_table
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
    """What gather_context gives the rules: the pin's envs.py names, its recorded argument table, renamed-env.yaml."""
    pins = load_pins()
    pin = pins.get(pin_name)
    table = recorded_table(pin)
    assert table is not None, pin_name
    return CheckContext(pin=pin, known_pins=tuple(pins.pins), series=tuple(load_all()), vllm_envs=_envs(pin_name),
                        vllm_options=frozenset(table["args"]), renamed_env=load_renamed())


def _sdist_text(pin_name: str, rel: str) -> str:
    pin = load_pins().get(pin_name)
    with tarfile.open(cache_root() / "sdists" / pin.sdist.file) as tar:
        for member in tar:
            if member.name.split("/", 1)[-1] == rel:
                handle = tar.extractfile(member)
                assert handle is not None
                return handle.read().decode()
    raise AssertionError(f"{pin_name}'s sdist has no {rel}")


def _literal(text: str, name: str) -> set[str]:
    """The strings of ``name = Literal[...]`` at a module's top level."""
    for node in ast.parse(text).body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name
                and isinstance(node.value, ast.Subscript)):
            elts = node.value.slice.elts if isinstance(node.value.slice, ast.Tuple) else [node.value.slice]
            return {e.value for e in elts if isinstance(e, ast.Constant)}
    raise AssertionError(f"no {name} = Literal[...]")


def _env_choices(text: str, name: str) -> set[str]:
    """The choices of ``"NAME": env_with_choices("NAME", default, [...])`` in an envs.py."""
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "env_with_choices"
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == name):
            assert isinstance(node.args[2], ast.List)
            return {e.value for e in node.args[2].elts if isinstance(e, ast.Constant)}
    raise AssertionError(f"no env_with_choices for {name}")


OPTION_TYPES = {"linear-backend": "LinearBackend", "moe-backend": "MoEBackend"}


@pytest.mark.parametrize("pin", ["vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"])
def test_each_renamed_value_is_one_the_pin_takes(pin: str) -> None:
    """renamed-env.yaml against the pins' own sources: the variables are 0.21.0's (every value 0.21.0 takes for
    the NVFP4 GEMM is listed), and each option value is in the later pin's own Literal for that option."""
    renamed = load_renamed()
    assert set(renamed) == DROPPED
    old = _sdist_text("vllm-0.21.0", "vllm/envs.py")
    assert set(renamed["VLLM_NVFP4_GEMM_BACKEND"].values) == _env_choices(old, "VLLM_NVFP4_GEMM_BACKEND")
    kernel = _sdist_text(pin, "vllm/config/kernel.py")
    ctx = _ctx(pin)
    for row in renamed.values():
        if row.option is None or row.env in (ctx.vllm_envs or ()):
            continue
        assert row.option in (ctx.vllm_options or ()), (pin, row.option)
        allowed = _literal(kernel, OPTION_TYPES[row.option])
        assert {v for v in row.values.values() if v is not None} <= allowed, (pin, row.env)


def test_rendering_for_a_pin_writes_the_recipes_kernel_choices_in_its_spelling() -> None:
    from g4build.recipes.env_names import fit_env_to_pin, user_env_names

    recipe = dataclasses.replace(load_recipe("gemma4-26b-a4b-nvfp4-dflash"), pin="vllm-0.33.0")
    ctx = _ctx("vllm-0.33.0")
    fitted, notes = fit_env_to_pin(recipe, ctx)
    assert not DROPPED & set(fitted.env) and set(recipe.env) - set(fitted.env) == DROPPED & set(recipe.env)
    assert fitted.args["linear-backend"] == "flashinfer_cutlass" and fitted.args["moe-backend"] == "marlin"
    assert {f.severity for f in notes} == {"info"} and len(notes) == len(DROPPED & set(recipe.env))
    assert [f for f in check(fitted, ctx) if f.severity != "info" and f.rule in ("env-names", "moe-backend",
                                                                              "flashinfer")] == []
    argv = serve_argv(fitted)
    assert argv[argv.index("--linear-backend") + 1] == "flashinfer_cutlass"
    assert argv[argv.index("--moe-backend") + 1] == "marlin"
    # a name the user asked for by hand stays, and is refused with the pin's spelling in the hint
    user = user_env_names(["env.VLLM_NVFP4_GEMM_BACKEND=cutlass", "args.max-num-seqs=4"])
    assert user == {"VLLM_NVFP4_GEMM_BACKEND"}
    kept, _ = fit_env_to_pin(recipe, ctx, user)
    assert "VLLM_NVFP4_GEMM_BACKEND" in kept.env and "linear-backend" not in kept.args
    [refused] = [f for f in check(kept, ctx) if f.rule == "env-names"]
    assert refused.severity == "error" and "--set args.linear-backend=VALUE" in refused.hint
    # a value with no same-meaning spelling there stays in the env and is refused
    odd = dataclasses.replace(recipe, env={**recipe.env, "VLLM_USE_FLASHINFER_MOE_FP4": "1"})
    left, _ = fit_env_to_pin(odd, ctx)
    assert left.env["VLLM_USE_FLASHINFER_MOE_FP4"] == "1" and "moe-backend" not in left.args
    assert [f.severity for f in check(left, ctx) if f.rule == "env-names"] == ["error"]
    # the recipe's own args win over a respelled variable, with a warning
    own = dataclasses.replace(recipe, args={**recipe.args, "linear-backend": "cutlass"})
    mine, said = fit_env_to_pin(own, ctx)
    assert mine.args["linear-backend"] == "cutlass"
    assert [f.severity for f in said if "VLLM_NVFP4_GEMM_BACKEND" in f.message] == ["warning"]
    # on the pin that reads them nothing changes; 0.26.0 reads only VLLM_TEST_FORCE_FP8_MARLIN of the three
    base = dataclasses.replace(load_recipe("gemma4-26b-a4b-nvfp4-dflash"), pin="vllm-0.21.0")
    same, none = fit_env_to_pin(base, _ctx("vllm-0.21.0"))
    assert none == [] and same == base
    mid, _ = fit_env_to_pin(dataclasses.replace(base, pin="vllm-0.26.0"), _ctx("vllm-0.26.0"))
    assert DROPPED & set(mid.env) == {"VLLM_TEST_FORCE_FP8_MARLIN"} and mid.args["moe-backend"] == "marlin"


@pytest.mark.parametrize("pin", ["vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"])
def test_the_no_flashinfer_fallback_switches_the_pins_linear_backend(pin: str) -> None:
    recipe, _ = fit_env_to_pin(dataclasses.replace(load_recipe("gemma4-26b-a4b-nvfp4-dflash"), pin=pin), _ctx(pin))
    absent = FlashInferInfo(presence="absent", why="no FlashInfer in its METADATA")
    plan = plan_launch(recipe, flashinfer=absent)
    assert plan.argv[plan.argv.index("--linear-backend") + 1] == "cutlass"
    assert not {name for name, _ in plan.env} & (DROPPED - (_envs(pin) or set()))
    with pytest.raises(RecipeError, match=r"--set args\.linear-backend opens a FlashInfer path"):
        plan_launch(recipe, flashinfer=absent, overrides=["args.linear-backend=flashinfer_cutlass"])
    unknown = plan_launch(recipe)
    assert unknown.argv[unknown.argv.index("--linear-backend") + 1] == "flashinfer_cutlass"
    assert [s.label for s in unknown.flashinfer_off if s.option] == ["--linear-backend cutlass"]
