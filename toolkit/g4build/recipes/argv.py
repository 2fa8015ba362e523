"""The one source of truth both renderers share: the exact argv after ``vllm`` and the env to set."""

from __future__ import annotations

import json
import math
from typing import Any

from g4build.errors import RecipeError
from g4build.recipes.model import ArgValue, Recipe


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


def serve_argv(recipe: Recipe) -> list[str]:
    """``serve MODEL [--served-model-name ...] [args in recipe order] [--speculative-config JSON]``."""
    argv = ["serve", recipe.model]
    if recipe.served_model_names:
        argv += ["--served-model-name", *recipe.served_model_names]
    for option, value in recipe.args.items():
        argv += option_words(option, value)
    if recipe.speculative:
        argv += ["--speculative-config", compact_json(recipe.speculative)]
    return argv


def env_items(recipe: Recipe) -> list[tuple[str, str]]:
    return list(recipe.env.items())
