"""vLLM 0.29.0 with an EAGLE-family drafter (DFlash, MTP) reads nothing back from the prefix cache by default (GPU
result); rendering for that pin sets dense retention (`--prefix-cache-retention-interval None`, per-pin recipe
data: prefix_cache.RETENTION_FOR_DRAFTERS). Here: the option is in 0.29.0's recorded argument table, every shipped
drafter recipe rendered for 0.29.0 passes it (and no other pin's does), `recipe check` says it is applied and not
yet run on a GPU; and 0.29.0's own KV cache manager, replayed on CPU, reads the hits back with it (a block or two
short, the same as an interval of one scheduler block) where the default reads none."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from tests.integration.recipes.conftest import g4build
from tests.support.tree_probe import run_tree_probe
from tests.support.trees import sdist_tree

from g4build.pins.model import load_pins
from g4build.recipes import load_recipe, recipe_names
from g4build.recipes.findings import CheckContext
from g4build.recipes.prefix_cache import RETENTION_ARG, RETENTION_FOR_DRAFTERS, fit_retention_to_pin
from g4build.recipes.vllm_args import recorded_table

DRAFTER_RECIPES = [n for n in recipe_names() if load_recipe(n).method in ("dflash", "mtp")]
OPTION = re.compile(r"'--prefix-cache-retention-interval'\s+'([^']*)'")


def test_the_retention_is_an_option_of_0290() -> None:
    table = recorded_table(load_pins().get("vllm-0.29.0"))
    assert table is not None and table["args"][RETENTION_ARG]["int"] is True
    assert RETENTION_FOR_DRAFTERS == {"vllm-0.29.0": "None"}


@pytest.mark.parametrize("name", DRAFTER_RECIPES)
def test_rendered_for_0290_a_drafter_recipe_sets_dense_retention(name: str) -> None:
    for pin in sorted(load_pins().pins):
        done = g4build("recipe", "render", name, "--shell", "bash", "--set", f"pin={pin}")
        assert done.returncode == 0, done.stderr
        assert OPTION.findall(done.stdout) == (["None"] if pin == "vllm-0.29.0" else []), (name, pin)
    check = g4build("recipe", "check", name, "--set", "pin=vllm-0.29.0")
    assert check.returncode == 0, check.stdout + check.stderr
    said = " ".join(check.stdout.split())
    assert "args.prefix-cache-retention-interval is None (dense retention" in said
    assert "applied for this pin" in said and "unproven on a GPU until that run exists" in said
    # the recipe's (or the user's) own retention stays, and is named as not run
    own = g4build("recipe", "render", name, "--shell", "bash", "--set", "pin=vllm-0.29.0",
                  "--set", "args.prefix-cache-retention-interval=64")
    assert OPTION.findall(own.stdout) == ["64"] and "is 64, which has not run on one" in " ".join(own.stderr.split())


def test_not_applied_without_a_drafter_or_with_caching_off() -> None:
    pins = load_pins()
    ctx = CheckContext(pin=pins.get("vllm-0.29.0"), known_pins=tuple(pins.pins))
    base = dataclasses.replace(load_recipe("gemma4-26b-a4b-nvfp4-baseline"), pin="vllm-0.29.0")
    assert fit_retention_to_pin(base, ctx) == base
    dflash = dataclasses.replace(load_recipe("gemma4-26b-a4b-nvfp4-dflash"), pin="vllm-0.29.0")
    assert fit_retention_to_pin(dflash, ctx).args[RETENTION_ARG] == "None"
    off = dataclasses.replace(dflash, args={**dflash.args, "enable-prefix-caching": False})
    assert RETENTION_ARG not in fit_retention_to_pin(off, ctx).args
    no_option = dataclasses.replace(ctx, vllm_options=frozenset({"max-model-len"}))
    assert fit_retention_to_pin(dflash, no_option) == dflash


@pytest.mark.network  # the pinned sdist (cached after the first run)
@pytest.mark.parametrize("shape", ["tiny", "26b"])
def test_0290s_kv_cache_manager_reads_the_hits_back_with_dense_retention(tmp_path: Path, shape: str) -> None:
    facts = run_tree_probe(Path(__file__).parent / "prefix_retention_probe.py", sdist_tree("vllm-0.29.0"), tmp_path,
                           "PREFIX_RETENTION", [shape])
    block = facts["scheduler_block_size"]
    target, dense = facts["None-target"], facts["None-eagle"]
    assert facts["0-target"] == target  # the target alone reads its prefix back by default (as on the GPU)
    assert dense == facts["scheduler-eagle"]  # dense = an interval of one scheduler block
    for i, (n, alone, hit) in enumerate(zip(facts["lengths"], target, dense, strict=True)):
        # a block or two short (the drafter's dropped last block, on the full group's coarser blocks for 26B), and
        # no retention reads more
        assert hit > 0 and alone - 2 * block <= hit < alone, (shape, n, alone, hit)
        assert hit == max(facts[f"{r}-eagle"][i] for r in ("0", "None", "scheduler", "1024")), (shape, n)
    # the default misses with a drafter: every prompt longer than the window (the GPU run's tiny target: 128)
    window = 128 if shape == "tiny" else 1024
    assert all(hit == 0 for n, hit in zip(facts["lengths"], facts["0-eagle"], strict=True) if n > window + 2 * block)
    assert facts["annotation"] == "int | None" and facts["cli"] == {"None": None, "32": 32}
