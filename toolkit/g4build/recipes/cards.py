"""Settings per card: a recipe's ``cards`` table changes its args for a card of that memory.

``hardware.vram_gb`` picks the row (``--set hardware.vram_gb=24``); a ``--set args.*`` of the user's still wins,
and a card without a row gets the args as written. Each row says what its numbers rest on (``basis``): a run of
the rendered script in that card's memory, or ``recipe check``'s arithmetic where no run has started it yet.

    cards:
      24:
        args: {gpu-memory-utilization: 0.9, max-num-batched-tokens: 2496, max-model-len: 32768}
        basis: the 8192 / 0.80 settings refused on the GPU (...); these are recipe check's, not yet started
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from g4build.errors import ConfigError
from g4build.recipes.findings import CheckContext, Finding
from g4build.recipes.model import MAX_GB, ArgValue, Recipe, parse_args, parse_text

CARD_KEYS = ("args", "basis")


@dataclass(frozen=True, kw_only=True)
class Card:
    vram_gb: float
    args: dict[str, ArgValue]
    basis: str

    def describe(self, final: dict[str, ArgValue] | None = None) -> str:
        """The row, with what a --set replaced named beside it (``final``: the args in effect)."""
        def one(key: str, value: ArgValue) -> str:
            now = value if final is None else final.get(key)
            shown = "unset" if now is None else now
            return f"{key} {value}" if now == value else f"{key} {value} (your --set: {shown})"
        changes = ", ".join(one(k, v) for k, v in self.args.items())
        return f"settings for a {self.vram_gb:g} GB card (the recipe's cards table): {changes}; {self.basis}"


def parse_cards(raw: Any, where: str) -> tuple[Card, ...]:
    """The ``cards`` table: GB (a number above 0) -> {args, basis}; None or absent: no rows."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of a card's memory in GB to its settings, found "
                          f"{type(raw).__name__}")
    out = []
    for gb, row in raw.items():
        here = f"{where}.{gb}"
        if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not 0 < gb <= MAX_GB:
            raise ConfigError(f"{where}: {gb!r} is not a card's memory in GB (a number above 0, e.g. 24)")
        if not isinstance(row, dict):
            raise ConfigError(f"{here}: expected a mapping with args and basis, found {type(row).__name__}")
        unknown = [k for k in row if k not in CARD_KEYS]
        if unknown:
            raise ConfigError(f"{here}: unknown key {unknown[0]!r} (a row has {', '.join(CARD_KEYS)})")
        basis = parse_text(row.get("basis"), f"{here}.basis", allow_none=True) or ""
        if not basis.strip():
            raise ConfigError(f"{here}.basis: say what these numbers rest on (a run, or the arithmetic)")
        args = parse_args(row.get("args"), f"{here}.args")
        if not args:
            raise ConfigError(f"{here}.args: a row changes at least one option")
        out.append(Card(vram_gb=float(gb), args=args, basis=basis))
    return tuple(out)


def card_for(cards: Sequence[Card], vram_gb: float) -> Card | None:
    return next((card for card in cards if card.vram_gb == vram_gb), None)


def with_card_args(data: dict[str, Any], card: Card) -> dict[str, Any]:
    """The recipe mapping with the card's args over its own (the user's --set applies after this)."""
    out = copy.deepcopy(data)
    args = out.get("args")
    out["args"] = {**(args if isinstance(args, dict) else {}), **card.args}
    return out


def rule_card(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    """Which row of the cards table applies, and what its numbers rest on."""
    return [Finding(rule="card", severity="info", message=recipe.card)] if recipe.card else []
