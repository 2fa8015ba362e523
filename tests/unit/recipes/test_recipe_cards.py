"""A recipe's cards table: hardware.vram_gb picks a row, whose args replace the recipe's under the user's --set;
the row is said (recipe check, the script's notes, show --json); a malformed table is refused with its place."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tests.support.yamltext import yaml_text

from g4build.errors import ConfigError, UsageError
from g4build.recipes import load_recipe, render
from g4build.recipes.rules import check

from .test_recipe_rules import ctx

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ("gemma4-26b-a4b-nvfp4-dflash", "gemma4-26b-a4b-nvfp4-mtp")
# the 24 GB row's context, and what its basis says of it (tests/gpu/results/vllm-0.21.0-card-fit.json): MTP's row
# started as written; DFlash's refused 32768 by 0.20 GiB, so it ships vLLM's estimate rounded down, not itself run
ROW_CONTEXT = {SHIPPED[0]: 24576, SHIPPED[1]: 32768}
ROW_BASIS = {SHIPPED[0]: "it has not itself started", SHIPPED[1]: "started as written"}


@pytest.mark.parametrize("name", SHIPPED)
def test_the_24_gb_row_applies_at_24_only(name: str) -> None:
    written = load_recipe(name)
    row = load_recipe(name, ["hardware.vram_gb=24"])
    assert (row.args["max-model-len"], row.args["max-num-batched-tokens"], row.args["gpu-memory-utilization"]) == (
        ROW_CONTEXT[name], 2496, 0.9)
    assert row.args["max-num-seqs"] == written.args["max-num-seqs"]  # what the row leaves alone stays
    assert "settings for a 24 GB card" in row.card and ROW_BASIS[name] in row.card
    for other in ("32", "24.5", "96"):
        assert load_recipe(name, [f"hardware.vram_gb={other}"]).card == ""
    assert load_recipe(name, ["hardware.vram_gb=24.0"]).card == row.card
    assert written.card == ""


@pytest.mark.parametrize("name", SHIPPED)
def test_the_row_passes_recipe_check(name: str) -> None:
    """A row a user gets by naming their card starts as far as the rules know: no error, no memory warning."""
    findings = check(load_recipe(name, ["hardware.vram_gb=24"]), ctx())
    assert not [f for f in findings if f.severity == "error"]
    assert not [f for f in findings if f.rule in ("vram", "mm-batched") and f.severity != "info"]
    [card] = [f for f in findings if f.rule == "card"]
    assert f"max-model-len {ROW_CONTEXT[name]}" in card.message
    assert not [f for f in check(load_recipe(name), ctx()) if f.rule == "card"]


def test_the_users_set_wins_over_the_row_and_the_script_says_which_row() -> None:
    recipe = load_recipe(SHIPPED[0], ["hardware.vram_gb=24", "args.max-model-len=16384"])
    assert recipe.args["max-model-len"] == 16384 and recipe.args["max-num-batched-tokens"] == 2496
    # the row is said as it applies: what the --set replaced is named beside it
    assert "max-model-len 24576 (your --set: 16384)" in recipe.card
    assert "max-num-batched-tokens 2496," in recipe.card
    gone = load_recipe(SHIPPED[0], ["hardware.vram_gb=24", "args.max-num-batched-tokens=null"])
    assert "max-num-batched-tokens 2496 (your --set: unset)" in gone.card
    script = render(recipe, "bash")
    notes = " ".join(line.lstrip("# ") for line in script.splitlines() if line.startswith("#"))
    assert "settings for a 24 GB card (the recipe's cards table)" in notes
    assert all(len(line) <= 112 for line in script.splitlines() if "24 GB" in line)
    words = [w.strip("'") for w in script.split()]
    assert words[words.index("--max-model-len") + 1] == "16384"


def _recipe_with(tmp_path: Path, cards: object) -> str:
    data = yaml.safe_load((ROOT / "recipes" / f"{SHIPPED[0]}.yaml").read_text(encoding="utf-8"))
    data["cards"] = cards
    path = tmp_path / f"{SHIPPED[0]}.yaml"
    path.write_text(yaml_text(data, sort_keys=False), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(("cards", "says"), [
    ([24], "expected a mapping of a card's memory in GB"),
    ({"big": {"args": {"max-model-len": 1}, "basis": "x"}}, "'big' is not a card's memory in GB"),
    ({0: {"args": {"max-model-len": 1}, "basis": "x"}}, "0 is not a card's memory in GB"),
    ({True: {"args": {"max-model-len": 1}, "basis": "x"}}, "True is not a card's memory in GB"),
    ({24: "max-model-len 1"}, "expected a mapping with args and basis"),
    ({24: {"args": {"max-model-len": 1}, "basis": "x", "env": {}}}, "unknown key 'env'"),
    ({24: {"args": {"max-model-len": 1}}}, "say what these numbers rest on"),
    ({24: {"args": {}, "basis": "x"}}, "a row changes at least one option"),
    ({24: {"args": {"--max-model-len": 1}, "basis": "x"}}, "is not an option name"),
    ({24: {"args": {"max-model-len": 1}, "basis": 5}}, "expected a string"),
])
def test_a_malformed_table_is_refused_with_its_place(tmp_path: Path, cards: object, says: str) -> None:
    path = _recipe_with(tmp_path, cards)
    with pytest.raises((ConfigError, UsageError), match="cards") as caught:
        load_recipe(path)
    assert says in caught.value.message


def test_an_empty_table_is_no_rows(tmp_path: Path) -> None:
    assert load_recipe(_recipe_with(tmp_path, None), ["hardware.vram_gb=24"]).card == ""


@pytest.mark.parametrize("item", ["cards=null", "cards.24.args.max-model-len=8192", "cards={}"])
def test_the_table_is_not_set_from_the_command_line(item: str) -> None:
    """A --set of the table itself would be read nowhere (the row comes from the file): it is refused."""
    with pytest.raises(UsageError, match="the cards table is the recipe's"):
        load_recipe(SHIPPED[0], [item])
