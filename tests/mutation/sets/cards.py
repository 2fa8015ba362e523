"""A recipe's cards table (cards.py, load_recipe): which row applies, what wins over it, what a row must say."""

from __future__ import annotations

from run_mutations import PKG, Mutation

CARDS = f"{PKG}/recipes/cards.py"
INIT = f"{PKG}/recipes/__init__.py"
TESTS = ("tests/unit/recipes/test_recipe_cards.py",)

M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    M("cards-any-card", CARDS, "for card in cards if card.vram_gb == vram_gb)", "for card in cards)", TESTS,
      "the first row applies to every card, 32 GB included"),
    M("cards-row-wins", INIT, "apply_overrides(with_card_args(data, card), sets)",
      "with_card_args(apply_overrides(data, sets), card)", TESTS, "the row overrides the user's --set args"),
    M("cards-no-basis", CARDS, "        if not basis.strip():", "        if False:", TESTS,
      "a row that says nothing of what its numbers rest on is taken"),
    M("cards-not-said", INIT, "    return dataclasses.replace(carded, card=card.describe(carded.args))",
      "    return carded", TESTS, "the row is applied silently: no card line in check, no note in the script"),
    M("cards-bool-gb", CARDS, "if isinstance(gb, bool) or not isinstance(gb, (int, float))",
      "if not isinstance(gb, (int, float))", TESTS, "true is taken as a 1 GB card"),
)
