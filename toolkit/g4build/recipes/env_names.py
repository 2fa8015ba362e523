"""The rule for the environment variables a recipe sets, against the pinned vLLM's own ``envs.py``: vLLM reads only
the names listed there and merely logs "Unknown vLLM environment variable" for another ``VLLM_`` name, so a variable
a release renamed or dropped (0.26.0 dropped VLLM_USE_FLASHINFER_MOE_FP4 and VLLM_NVFP4_GEMM_BACKEND, 0.29.0 also
VLLM_TEST_FORCE_FP8_MARLIN; they choose kernels with --moe-backend / --linear-backend) silently changes nothing.
Pure, like every rule: the names come in the context (None when the pin's sdist is not in the cache). Rendering
for such a pin writes the recipe's own variables in the pin's spelling (``renamed_env``) first."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable

from g4build.recipes.findings import CheckContext, Finding, serving_pin
from g4build.recipes.model import Recipe
from g4build.recipes.renamed_env import Respelled, respell, respelling_hint

VLLM_PREFIX = "VLLM_"


def user_env_names(sets: Iterable[str]) -> frozenset[str]:
    """The environment variables named by ``--set env.NAME=VALUE``."""
    out = set()
    for item in sets:
        key = item.split("=", 1)[0].strip()
        if key.startswith("env."):
            out.add(key[len("env."):])
    return frozenset(out)


def _respelled_finding(ctx: CheckContext, found: Respelled, kept: object) -> Finding:
    pin = f"vLLM {ctx.pin.version if ctx.pin else '?'}"
    if found.option is None or found.value is None:
        return Finding(rule="env-names", severity="info",
                       message=f"env {found.env}={found.was}: left out: {pin} does not read it, and {found.why}")
    if kept is not None and str(kept) != found.value:
        return Finding(rule="env-names", severity="warning",
                       message=f"env {found.env}={found.was}: left out: {pin} spells it --{found.option} "
                               f"{found.value}, but the recipe's args.{found.option} is {kept!r}, which stays",
                       hint=f"drop one of the two; {found.why}")
    return Finding(rule="env-names", severity="info",
                   message=f"env {found.env}={found.was}: rendered as --{found.option} {found.value} for {pin}, "
                           f"which does not read the variable ({found.why})")


def fit_env_to_pin(recipe: Recipe, ctx: CheckContext, user_names: frozenset[str] = frozenset()) -> tuple[
        Recipe, list[Finding]]:
    """The recipe in its pin's spelling: a ``VLLM_`` variable of the recipe's own file that the pin's vLLM does not
    read becomes the serve option renamed-env.yaml names for it (0.26.0 and later took 0.21.0's kernel choices
    into --linear-backend / --moe-backend), with an info each; one without a same-meaning spelling there is
    left out with a warning, unless the file knows the variable (then it stays, and rule_env_names refuses it:
    that value has no spelling on the pin). A name the user set with ``--set env.NAME=`` stays, and is refused."""
    if ctx.pin is None or ctx.vllm_envs is None:
        return recipe, []
    env, args = dict(recipe.env), dict(recipe.args)
    findings = []
    for name in sorted(recipe.env):
        if not name.startswith(VLLM_PREFIX) or name in ctx.vllm_envs or name in user_names:
            continue
        found = respell(name, recipe.env[name], ctx.renamed_env, ctx.vllm_options)
        if found is None and name in ctx.renamed_env:
            continue  # a value with no spelling on this pin: rule_env_names says so
        del env[name]
        if found is None:
            findings.append(Finding(rule="env-names", severity="warning",
                                    message=f"env {name}: left out of the script: vLLM {ctx.pin.version} "
                                            f"({ctx.pin.name}) does not read it (the recipe sets it for the pins "
                                            "that do)",
                                    hint="the pin's own serve options may cover it (vllm serve --help)"))
            continue
        kept = args.get(found.option) if found.option else None
        findings.append(_respelled_finding(ctx, found, kept))
        if found.option is not None and found.value is not None and kept is None:
            args[found.option] = found.value
    if env == recipe.env:
        return recipe, findings
    return dataclasses.replace(recipe, env=env, args=args), findings


def rule_env_names(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    names = sorted(n for n in recipe.env if n.upper().startswith(VLLM_PREFIX))
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
        if name.upper() in ctx.vllm_envs:  # the same variable on Windows only: Linux and WSL keep case
            out.append(Finding(rule="env-names", severity="error",
                               message=f"env {name}: vLLM {ctx.pin.version} reads {name.upper()}; on Linux and in "
                                       f"WSL {name} is another variable, which it never reads",
                               hint=f"spell it {name.upper()}"))
            continue
        close = difflib.get_close_matches(name, sorted(ctx.vllm_envs), n=2, cutoff=0.8)
        out.append(Finding(rule="env-names", severity="error",
                           message=f"env {name}: vLLM {ctx.pin.version} ({ctx.pin.name}) does not read it (not in "
                                   "its envs.py); it would log 'Unknown vLLM environment variable' and change "
                                   "nothing",
                           hint=(f"did you mean {' or '.join(close)}? " if close else "")
                                + respelling_hint(name, ctx.renamed_env, ctx.vllm_options)
                                + "drop it for this pin, or use the pin's own option for it (vllm serve --help)"))
    return out


def rule_env_allowed(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    policy = ctx.env_policy
    if policy is None:
        return []
    out = []
    for name in sorted(recipe.env):
        verdict = policy.verdict(name, serving_pin(recipe, ctx), ctx.allowed_env)
        if verdict == "denied":
            out.append(Finding(rule="env-allowed", severity="error",
                               message=f"env {name}: refused: a launch script never sets it (it can run code or "
                                       "turn off a check when the script starts; deny-list of "
                                       f"{policy.source}), even with --allow-env",
                               hint=f"drop env.{name} from the recipe; if you need it, set it in your own shell "
                                    "before starting the script"))
        elif verdict == "unknown":
            out.append(Finding(rule="env-allowed", severity="error",
                               message=f"env {name}: refused: not a name vLLM, CUDA, NCCL, PyTorch or the launch "
                                       f"reads (allow-list of {policy.source}), and a recipe is data",
                               hint=f"drop it, or pass --allow-env {name} to set it anyway (you vouch for it)"))
        elif verdict == "asked":
            out.append(Finding(rule="env-allowed", severity="warning",
                               message=f"env {name}: set because the command line said --allow-env {name} (it is "
                                       f"not on the allow-list of {policy.source})"))
        elif name != name.upper() and not name.upper().startswith(VLLM_PREFIX):  # VLLM_: rule_env_names says it
            out.append(Finding(rule="env-allowed", severity="warning",
                               message=f"env {name}: the programs that read it spell it {name.upper()}; on Linux and "
                                       f"in WSL {name} is another variable, which nothing reads (only Windows "
                                       "takes either spelling)",
                               hint=f"spell it {name.upper()}"))
    return out
