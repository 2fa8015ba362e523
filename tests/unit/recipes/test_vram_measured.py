"""The VRAM rule held to the card-fit runs (tests/gpu/results/vllm-0.21.0-card-fit.json): the recipes' launch
scripts as rendered, with real_size.py's Gemma 4 26B-A4B shapes, in a card's share of an H200 (bf16 weights standing
in for the recipe's NVFP4 ones: the budget grew by the difference). For every run, the recipe's own table and the
superseded settings alike, the rule's verdict at the run's card and settings is vLLM's: no warning where vLLM
started, a warning where it refused. The runtime the rule charges is what vLLM's profile took there, and the KV
cache per request vLLM reported is kv_need.py's.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from g4build.recipes import load_recipe
from g4build.recipes.findings import Finding
from g4build.recipes.kv_need import layer_kinds, need_bytes
from g4build.recipes.rules import check
from g4build.recipes.vram import CUDA_GRAPH_GIB, LOADED_BEYOND_WEIGHTS_GIB, RUNTIME_MEASURED, runtime_gib

from .test_recipe_rules import ctx

ROOT = Path(__file__).resolve().parents[3]
FOLD = json.loads((ROOT / "tests" / "gpu" / "results" / "vllm-0.21.0-card-fit.json").read_text(encoding="utf-8"))
GIB = 1 << 30
FIRST_RUN_BATCHED = 32768  # the superseded run rendered the recipe of that day, before attempts recorded it


def _rows() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for part in ("table", "superseded"):
        table = FOLD["table"] if part == "table" else FOLD.get("superseded", {}).get("table", {})
        for recipe, cards in table.items():
            out += [(f"{part}:{recipe}:{key}", recipe, row) for key, row in cards.items()]
    return out


ROWS = _rows()


def _batched(row: dict[str, Any]) -> int:
    return int(row["at"].get("max_num_batched_tokens") or FIRST_RUN_BATCHED)


def _as_run(recipe_name: str, row: dict[str, Any]) -> Any:
    """The recipe as the run rendered it: the card's memory, the shipped context and max-num-seqs of that run,
    its max-num-batched-tokens and whatever else it changed."""
    recipe = load_recipe(recipe_name)
    args = {**recipe.args, "max-model-len": row["shipped"]["context"], "max-num-seqs": row["shipped"]["max_num_seqs"],
            "max-num-batched-tokens": _batched(row), "gpu-memory-utilization": row["card_util"],
            **row.get("changed", {})}
    return dataclasses.replace(recipe, args=args,
                               hardware=dataclasses.replace(recipe.hardware, vram_gb=row["card_gib"]))


def _vram(recipe: Any) -> Finding:
    [finding] = [f for f in check(recipe, ctx()) if f.rule == "vram"]
    return finding


MM_REFUSAL = "Chunked MM input disabled"  # vLLM's refusal before any memory is asked (mm_batched.py)


def _refused_for_mm(row: dict[str, Any]) -> bool:
    return not row["started_at_shipped"] and MM_REFUSAL in (row.get("shipped_error") or "")


def test_there_are_runs_that_started_and_runs_that_did_not() -> None:
    started = [row["started_at_shipped"] for _, _, row in ROWS]
    assert True in started and False in started and len(ROWS) >= 4


@pytest.mark.parametrize(("label", "recipe", "row"), ROWS, ids=[r[0] for r in ROWS])
def test_the_rules_verdict_is_vllms(label: str, recipe: str, row: dict[str, Any]) -> None:
    """Where vLLM started, no rule says it will not; where it refused for memory, the VRAM rule warns; where it
    refused a multimodal item longer than max-num-batched-tokens (before loading anything), mm-batched says so in
    vLLM's own words."""
    findings = check(_as_run(recipe, row), ctx())
    mm = [f for f in findings if f.rule == "mm-batched"]
    if _refused_for_mm(row):
        assert [f.severity for f in mm] == ["error"]
        quoted = mm[0].message.split('("', 1)[1].rsplit('")', 1)[0]
        assert quoted in row["shipped_error"], (quoted, row["shipped_error"])
        return
    assert not mm, mm
    # the stand-in's budget is the card's plus what bf16 outweighs the recipe's weights by; what vLLM loaded
    # beyond the counted parameters (stand_in_residual_gib) it loads on a card too, and the rule charges it
    assert row["stand_in"] is not None and abs(row["at"]["stand_in_residual_gib"]) < 0.5
    finding = _vram(_as_run(recipe, row))
    assert (finding.severity != "warning") == row["started_at_shipped"], finding.message


@pytest.mark.parametrize(("label", "recipe", "row"), [r for r in ROWS if r[2]["at"].get("available_kv_gib")],
                         ids=[r[0] for r in ROWS if r[2]["at"].get("available_kv_gib")])
def test_the_rules_kv_room_is_vllms_available_kv_cache(label: str, recipe: str, row: dict[str, Any]) -> None:
    """Budget less the recipe's weights, what vLLM loads beside them and the runtime at the run's batched tokens:
    vLLM's own "Available KV cache memory" where the run's runtime is the line's (within its two-decimal print),
    never more where vLLM's profile took less (one 24 GB run peaked lower than the 32 GB run at the same 8192)."""
    method = "mtp" if "-mtp" in recipe else "dflash"
    fp = load_recipe(recipe).footprint
    assert fp is not None
    assert row["at"]["stand_in_residual_gib"] == LOADED_BEYOND_WEIGHTS_GIB[method]
    runtime = runtime_gib(_batched(row), method=method)
    room = row["card_util"] * row["card_gib"] - fp.weights_gib - LOADED_BEYOND_WEIGHTS_GIB[method] - runtime
    available = row["at"]["available_kv_gib"]
    if abs(row["at"]["overhead_gib"] - runtime) <= 0.01:
        assert room == pytest.approx(available, abs=0.02), (room, row["at"])
    else:
        assert row["at"]["overhead_gib"] < runtime and room < available, (room, row["at"])


def test_the_shipped_recipes_are_the_ones_measured() -> None:
    """The table's rows are the recipes as they ship now (else the fold belongs under superseded)."""
    for recipe, cards in FOLD["table"].items():
        for row in cards.values():
            # as a user renders it for that card: the row of the recipe's cards table, if it has one
            shipped = load_recipe(recipe, [f"hardware.vram_gb={row['card_gib']:g}"]).args
            assert row["card_util"] == row.get("changed", {}).get("gpu-memory-utilization",
                                                                  shipped["gpu-memory-utilization"])
            # a row run with changed settings (a way out tried) is the shipped recipe with those changes
            batched = int(row.get("changed", {}).get("max-num-batched-tokens", shipped["max-num-batched-tokens"]))
            assert (shipped["max-model-len"], shipped["max-num-seqs"], batched) == (
                row["shipped"]["context"], row["shipped"]["max_num_seqs"], _batched(row))


def _method(recipe: str) -> str:
    return "mtp" if "-mtp" in recipe else "dflash"


def test_the_runtime_is_what_vllms_profile_took() -> None:
    measured: dict[str, set[tuple[int, float]]] = {}
    for _, recipe, row in ROWS:
        if not _refused_for_mm(row):
            measured.setdefault(_method(recipe), set()).add((_batched(row), row["at"]["overhead_gib"]))
    assert set(RUNTIME_MEASURED) == set(measured) == {"dflash", "mtp"}
    for method, points in RUNTIME_MEASURED.items():
        # the line runs through the method's measured points, one per max-num-batched-tokens run
        assert set(points) <= measured[method]
        assert [b for b, _ in points] == sorted({b for b, _ in measured[method]})
        # and charges at least what any run took at its max-num-batched-tokens
        for batched, overhead in measured[method]:
            assert runtime_gib(batched, method=method) >= overhead - 0.005
    for method, graph in CUDA_GRAPH_GIB.items():
        graphs = {row["at"]["graph_estimate_gib"] for _, recipe, row in ROWS
                  if _method(recipe) == method and not _refused_for_mm(row)}
        assert max(graphs) == graph
        assert runtime_gib(8192, eager=True, method=method) == pytest.approx(runtime_gib(8192, method=method) - graph)
    d = "dflash"
    assert runtime_gib(2496, method=d) == pytest.approx(2.94)
    assert runtime_gib(5344, method=d) == pytest.approx((2.94 + 3.71) / 2)  # halfway between the two lower points
    assert runtime_gib(20480, method=d) == pytest.approx((3.71 + 7.43) / 2)
    assert runtime_gib(2048, method=d) == pytest.approx(2.94 - 448 * (3.71 - 2.94) / 5696)  # lower segment, down
    assert runtime_gib(65536, method=d) == pytest.approx(7.43 + 32768 * (7.43 - 3.71) / 24576)  # upper one, up
    assert runtime_gib(-5, method=d) == runtime_gib(0, method=d)
    # past MTP's last point its own slope would give 5.76 GiB at 32768; the target's growth, which DFlash measured
    # there, is what both drafters share: DFlash's line less the graphs MTP does not capture
    assert runtime_gib(32768, method="mtp") == pytest.approx(7.43 - 0.89 + 0.19)
    assert runtime_gib(8192, method="mtp") == pytest.approx(2.87)  # within its points, its own line
    # a drafter never measured (and the target alone) is charged the largest: DFlash's
    assert runtime_gib(8192, method="eagle3") == runtime_gib(8192) == runtime_gib(8192, method=d)


@pytest.mark.parametrize(("label", "recipe", "row"), [r for r in ROWS if r[2]["at"].get("max_concurrency")],
                         ids=[r[0] for r in ROWS if r[2]["at"].get("max_concurrency")])
def test_kv_per_request_is_what_vllm_reported(label: str, recipe: str, row: dict[str, Any]) -> None:
    """vLLM's available KV cache over its concurrency at the context (each printed at two decimals) is the KV
    cache of one request: kv_need.py's figure, the drafter's layers included."""
    fp = load_recipe(recipe).footprint
    assert fp is not None and fp.kv is not None
    as_full = "dflash" in recipe  # vllm-0.21.0: dflash-batched-verification allocates them as full attention
    kinds = layer_kinds(fp.kv, fp.draft_kv if as_full else None, drafter_sliding_as_full=as_full)
    need = need_bytes(kinds, row["at"]["context"], _batched(row), 2) / GIB
    available, concurrency = row["at"]["available_kv_gib"], row["at"]["max_concurrency"]
    assert (available - 0.005) / (concurrency + 0.005) <= need <= (available + 0.005) / (concurrency - 0.005)


def test_a_card_too_small_for_the_runtime_gets_a_way_out() -> None:
    """24 GB: the 16.5 GiB of weights and 3.7 GiB of runtime exceed 0.8 x 24 (vLLM: "No available memory for
    the cache blocks" at every max-num-seqs); the hint names what would leave room, in the rule's own arithmetic."""
    recipe = load_recipe("gemma4-26b-a4b-nvfp4-dflash")
    small = dataclasses.replace(recipe, hardware=dataclasses.replace(recipe.hardware, vram_gb=24))
    finding = _vram(small)
    assert finding.severity == "warning" and "No available memory for the cache blocks" in finding.message
    assert finding.hint is not None
    # not 2048: vLLM refused it (the way-out runs: Gemma 4's 2,496-token video item must fit one step)
    # vLLM's own estimate at these settings was 27,488 (the 24 GB row's run at 32768)
    assert "with gpu-memory-utilization 0.9 and max-num-batched-tokens 2496, max-model-len up to 27392 fits" \
        in finding.hint
    taken = dataclasses.replace(small, args={**small.args, "gpu-memory-utilization": 0.9,
                                             "max-num-batched-tokens": 2496, "max-model-len": 27392})
    assert _vram(taken).severity != "warning"
    assert not [f for f in check(taken, ctx()) if f.severity == "error"]
    over = dataclasses.replace(taken, args={**taken.args, "max-model-len": 27393 + 16})
    assert _vram(over).severity == "warning"


def test_an_eager_recipe_is_not_charged_cuda_graphs() -> None:
    recipe = load_recipe("gemma4-26b-a4b-nvfp4-dflash")
    eager = dataclasses.replace(recipe, args={**recipe.args, "enforce-eager": True})
    assert "runtime 3.7 GiB at max-num-batched-tokens 8192" in _vram(recipe).message
    assert "runtime 2.8 GiB at max-num-batched-tokens 8192" in _vram(eager).message


def test_the_way_out_prefers_the_smaller_prefill_chunk() -> None:
    """MTP on 24 GB: at 0.85 the 8192-token chunk leaves no room for 4,096 tokens of context, the 2496 one (the
    least vLLM starts Gemma 4 with, its video item) for 7,616: the hint names the second. Without video
    (limit-mm-per-prompt) the floor is an image's 280 tokens, and the hint goes down to vLLM serve's 2048."""
    recipe = load_recipe("gemma4-26b-a4b-nvfp4-mtp")
    small = dataclasses.replace(recipe, hardware=dataclasses.replace(recipe.hardware, vram_gb=24))
    hint = _vram(small).hint or ""
    assert "with gpu-memory-utilization 0.85 and max-num-batched-tokens 2496, max-model-len up to 7616 fits" in hint
    no_video = dataclasses.replace(small, args={**small.args, "limit-mm-per-prompt": {"video": 0}})
    assert "and max-num-batched-tokens 2048, max-model-len up to 14848 fits" in (_vram(no_video).hint or "")


def test_weights_over_the_budget_are_an_out_of_memory_while_loading() -> None:
    recipe = load_recipe("gemma4-31b-dflash")
    small = dataclasses.replace(recipe, hardware=dataclasses.replace(recipe.hardware, vram_gb=24))
    finding = _vram(small)
    assert finding.severity == "warning" and "the weights alone exceed the budget" in finding.message
    assert "max-num-batched-tokens" not in (finding.hint or "")


def test_without_chunked_prefill_the_way_out_keeps_the_prefill_at_max_model_len() -> None:
    """vLLM 0.21.0 refuses max-num-batched-tokens below max-model-len when chunked prefill is off
    (config/scheduler.py): the hint may only raise the utilization."""
    recipe = load_recipe("gemma4-26b-a4b-nvfp4-mtp")
    args = {k: v for k, v in recipe.args.items() if k != "max-num-batched-tokens"}
    off = dataclasses.replace(recipe, args={**args, "enable-chunked-prefill": False, "max-model-len": 8192},
                              hardware=dataclasses.replace(recipe.hardware, vram_gb=24))
    finding = _vram(off)
    assert finding.severity == "warning"
    # no smaller chunk of any size (2048, 4096, nor the multimodal floor 2496): only the utilization moves
    assert not re.search(r"max-num-batched-tokens \d+", finding.hint or ""), finding.hint
    assert "lower max-num-batched-tokens" not in (finding.hint or "")


def test_a_geometry_vllm_cannot_unify_gets_no_way_out_and_no_crash() -> None:
    """A footprint whose pages are no whole multiple of one another (3 heads of 100 beside 8 of 256): kv_need
    raises for it; on a card with no room the rule still warns, without naming a context it cannot compute."""
    recipe = load_recipe("gemma4-26b-a4b-nvfp4-dflash")
    assert recipe.footprint is not None and recipe.footprint.kv is not None
    odd = dataclasses.replace(recipe.footprint, kv=dataclasses.replace(recipe.footprint.kv, full_kv_heads=3,
                                                                       full_head_dim=100), draft_kv=None)
    small = dataclasses.replace(recipe, footprint=odd, hardware=dataclasses.replace(recipe.hardware, vram_gb=24))
    finding = _vram(small)
    assert finding.severity == "warning" and "No available memory for the cache blocks" in finding.message
    assert "max-model-len up to" not in (finding.hint or "")
