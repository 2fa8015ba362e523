"""Whole-number ``vllm serve`` options as vLLM reads them: ``131072``, or the human-readable ``128k`` (decimal
suffixes k/m/g/t) and ``2K`` (binary suffixes K/M/G/T, whole numbers only) that vLLM's ``human_readable_int``
parsers take for max-model-len, max-num-batched-tokens and the like (a recipe or ``--set`` may hold either)."""

from __future__ import annotations

import re

from g4build.recipes.model import MAX_COUNT, Recipe

_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def human_int(text: str) -> int | None:
    """The number vLLM reads from '128k' or '2K'; None when vLLM would not read one."""
    match = _HUMAN.fullmatch(text.strip())
    if match is None or (match.group(2).isupper() and "." in match.group(1)):
        return None
    number, suffix = match.group(1), match.group(2)
    # int ** int is typed Any (a negative power gives a float); these powers are positive
    if suffix.isupper():
        scale: int = 1024 ** ("KMGT".index(suffix) + 1)
        return int(number) * scale
    scale = 1000 ** ("kmgt".index(suffix) + 1)
    return int(float(number) * scale)


def int_arg(recipe: Recipe, option: str) -> int | None:
    """A whole-number option in range (1 to ``MAX_COUNT``), written plain or with vLLM's suffixes; None when unset,
    not a number vLLM reads, or out of range (which ``rule_counts`` refuses): no estimate is made from a negative
    or absurd count."""
    value = recipe.args.get(option)
    if isinstance(value, str):
        value = human_int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return value if 1 <= value <= MAX_COUNT else None
