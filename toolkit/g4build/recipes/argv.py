"""The one source of truth both renderers share: the exact argv after ``vllm`` and the env to set."""

from __future__ import annotations

import json
import math
from typing import Any

from g4build.errors import RecipeError
from g4build.recipes.model import SLIDING_ATTENTION_BACKENDS, ArgValue, Recipe

ATTENTION_CONFIG = "attention-config"
SLIDING_KIND = "sliding_window"  # vLLM's name for the sliding-window layers' kind (KV cache group)


def compact_json(value: Any) -> str:
    """JSON as vLLM's JSON options take it: no spaces, keys in the recipe's order, text kept as written."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:  # NaN / infinity have no JSON form
        raise RecipeError(f"{value!r} cannot be written as JSON: {exc}", hint="use finite numbers") from exc


def _word(value: str | int | float, option: str) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RecipeError(f"option --{option}: {value!r} is not a finite number")
        return repr(value)
    return str(value)


def _looks_like_option(text: str) -> bool:
    """argparse would read a separate word starting with '-' as an option unless it is a negative number."""
    if not text.startswith("-"):
        return False
    try:
        float(text)
    except ValueError:
        return True
    return False


def option_words(option: str, value: ArgValue) -> list[str]:
    """The words one recipe option becomes.

    ``true`` -> ``--opt``; ``false`` -> ``--no-opt`` (vLLM's boolean options are BooleanOptionalAction);
    a list -> ``--opt a b``; a mapping -> ``--opt`` + compact JSON; a value starting with '-' is glued as
    ``--opt=value`` so argparse cannot mistake it for an option.
    """
    flag = f"--{option}"
    if value is True:
        return [flag]
    if value is False:
        return [f"--no-{option}"]
    if isinstance(value, dict):
        return [flag, compact_json(value)]
    if isinstance(value, list):
        words = [_word(item, option) for item in value]
        bad = [w for w in words if _looks_like_option(w)]
        if bad or not words:
            raise RecipeError(
                f"option --{option}: list values cannot be empty or start with '-' (found {value!r})",
                hint="give a single value instead; it is then passed as --option=value",
            )
        return [flag, *words]
    word = _word(value, option)
    return [f"{flag}={word}"] if _looks_like_option(word) else [flag, word]


def attention_config(recipe: Recipe) -> dict[str, Any] | None:
    """``--attention-config`` as the recipe asks for it: ``args.attention-config`` with, for
    ``sliding_attention_backend``, ``backend_per_kind`` naming that backend for the sliding-window layers (the
    same JSON on every pin that has per-kind backends). None when neither is set."""
    given = recipe.args.get(ATTENTION_CONFIG)
    if recipe.sliding_attention_backend is None:
        return given if isinstance(given, dict) else None
    if given is not None and not isinstance(given, dict):
        raise RecipeError(
            f"args.{ATTENTION_CONFIG} is {given!r}; with sliding_attention_backend it must be a mapping to add "
            "backend_per_kind to",
            hint=f"write args.{ATTENTION_CONFIG} as a YAML mapping, or drop it",
        )
    config = dict(given or {})
    per_kind = config.get("backend_per_kind") or {}
    if not isinstance(per_kind, dict):
        raise RecipeError(f"args.{ATTENTION_CONFIG}.backend_per_kind is {per_kind!r}: expected a mapping")
    wanted = SLIDING_ATTENTION_BACKENDS[recipe.sliding_attention_backend]
    already = per_kind.get(SLIDING_KIND)
    if already is not None and str(already).upper() != wanted:
        raise RecipeError(
            f"args.{ATTENTION_CONFIG}.backend_per_kind.{SLIDING_KIND} is {already!r}, but "
            f"sliding_attention_backend asks for {recipe.sliding_attention_backend}",
            hint="keep one of the two",
        )
    config["backend_per_kind"] = {**per_kind, SLIDING_KIND: wanted}
    return config


def serve_argv(recipe: Recipe) -> list[str]:
    """``serve MODEL [--served-model-name ...] [args in recipe order] [--attention-config JSON]
    [--speculative-config JSON]``; an ``args.attention-config`` keeps its place, with the sliding-window layers'
    backend added when the recipe names one."""
    argv = ["serve", recipe.model]
    if recipe.served_model_names:
        argv += ["--served-model-name", *recipe.served_model_names]
    attention = attention_config(recipe)
    for option, value in recipe.args.items():
        argv += option_words(option, attention if option == ATTENTION_CONFIG and attention is not None else value)
    if attention is not None and ATTENTION_CONFIG not in recipe.args:
        argv += option_words(ATTENTION_CONFIG, attention)
    if recipe.speculative:
        argv += ["--speculative-config", compact_json(recipe.speculative)]
    return argv


def env_items(recipe: Recipe) -> list[tuple[str, str]]:
    return list(recipe.env.items())
