"""The rule for the environment variables a recipe sets, against the pinned vLLM's own ``envs.py``: vLLM reads only
the names listed there and merely logs "Unknown vLLM environment variable" for another ``VLLM_`` name, so a variable
a release renamed or dropped (0.29.0 and 0.33.0 dropped VLLM_USE_FLASHINFER_MOE_FP4, VLLM_TEST_FORCE_FP8_MARLIN and
VLLM_NVFP4_GEMM_BACKEND; 0.33.0 chooses kernels with --moe-backend / --linear-backend) silently changes nothing.
Pure, like every rule: the names come in the context (None when the pin's sdist is not in the cache)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable

from g4build.recipes.findings import CheckContext, Finding
from g4build.recipes.model import Recipe

VLLM_PREFIX = "VLLM_"


def user_env_names(sets: Iterable[str]) -> frozenset[str]:
    """The environment variables named by ``--set env.NAME=VALUE``."""
    out = set()
    for item in sets:
        key = item.split("=", 1)[0].strip()
        if key.startswith("env."):
            out.add(key[len("env."):])
    return frozenset(out)


def fit_env_to_pin(recipe: Recipe, ctx: CheckContext, user_names: frozenset[str] = frozenset()) -> tuple[
        Recipe, list[Finding]]:
    """The recipe without the ``VLLM_`` variables its own file sets that the pin's vLLM does not read (a recipe is
    written for several pins: 0.29.0 and 0.33.0 dropped three of 0.21.0's), with a warning naming each. A name the
    user set with ``--set env.NAME=`` stays, and rule_env_names refuses it."""
    if ctx.pin is None or ctx.vllm_envs is None:
        return recipe, []
    dropped = sorted(n for n in recipe.env
                     if n.startswith(VLLM_PREFIX) and n not in ctx.vllm_envs and n not in user_names)
    if not dropped:
        return recipe, []
    env = {k: v for k, v in recipe.env.items() if k not in dropped}
    findings = [Finding(rule="env-names", severity="warning",
                        message=f"env {n}: left out of the script: vLLM {ctx.pin.version} ({ctx.pin.name}) does not "
                                "read it (the recipe sets it for the pins that do)",
                        hint="the pin's own serve options may cover it (vllm serve --help)") for n in dropped]
    return dataclasses.replace(recipe, env=env), findings


def rule_env_names(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    names = sorted(n for n in recipe.env if n.startswith(VLLM_PREFIX))
    if not names or ctx.pin is None:
        return []
    if ctx.vllm_envs is None:
        return [Finding(rule="env-names", severity="info",
                        message=f"environment variables not checked against vLLM {ctx.pin.version}: its sdist is "
                                "not in the cache",
                        hint=f"run `g4build source fetch --pin {ctx.pin.name}` once to check them")]
    out = []
    for name in names:
        if name in ctx.vllm_envs:
            continue
        close = difflib.get_close_matches(name, sorted(ctx.vllm_envs), n=2, cutoff=0.8)
        out.append(Finding(rule="env-names", severity="error",
                           message=f"env {name}: vLLM {ctx.pin.version} ({ctx.pin.name}) does not read it (not in "
                                   "its envs.py); it would log 'Unknown vLLM environment variable' and change "
                                   "nothing",
                           hint=(f"did you mean {' or '.join(close)}? " if close else "")
                                + "drop it for this pin, or use the pin's own option for it (vllm serve --help)"))
    return out
