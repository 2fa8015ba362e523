"""The KV cache vLLM requires before it starts (kv_need.py), held to what vLLM 0.21.0 itself reported on the GPU.

The run (tests/gpu/results/vllm-0.21.0-card-fit.json, its attempt in tests/gpu/results/card-fit/): the DFlash
recipe's launch script as rendered that day (max-model-len 131072, max-num-batched-tokens 32768), with real_size.py's
Gemma 4 26B-A4B and DFlash drafter shapes, in a 32 GB card's share of an H200. vLLM refused to start and said why, in
its own numbers: the KV cache one request needs, what it had, and the longest context that would fit.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import ModuleType

import pytest
from tests.unit.gpu_scripts.test_acceptance import _load

from g4build.pins.model import load_pins
from g4build.recipes import load_recipe
from g4build.recipes.checkpoint import kv_geometry
from g4build.recipes.kv_need import (
    DFLASH_SLIDING_AS_FULL_PINS,
    LayerKind,
    layer_kinds,
    longest_context,
    need_bytes,
)
from g4build.recipes.model import KvGeometry, Recipe
from g4build.recipes.rules import Finding, check

from .test_recipe_rules import checkpoint, ctx

ROOT = Path(__file__).resolve().parents[3]
FOLD = ROOT / "tests" / "gpu" / "results" / "vllm-0.21.0-card-fit.json"
GIB = 1 << 30
RECORDED_BATCHED = 32768  # the recipe's max-num-batched-tokens when the run rendered it (the users' value)


def _real_size() -> ModuleType:
    return _load("real_size")


def _recorded() -> dict[str, float]:
    # the recipe no longer ships these settings: the fold keeps the run under superseded
    row = json.loads(FOLD.read_text(encoding="utf-8"))["superseded"]["table"]["gemma4-26b-a4b-nvfp4-dflash"][
        "32 stand-in"]
    assert row["shipped"] == {"context": 131072, "max_num_seqs": 22} and row["started_at_shipped"] is False
    error = row["shipped_error"]
    need = re.search(r"\(([\d.]+) GiB KV cache is needed", error)
    have = re.search(r"available KV cache memory \(([\d.]+) GiB\)", error)
    assert need and have, error
    return {"need_gib": float(need.group(1)), "available_gib": float(have.group(1)),
            "estimated": row["vllm_estimated_max_model_len"], "context": row["shipped"]["context"]}


def _dflash_kinds(as_full: bool = True) -> list[LayerKind]:
    fp = load_recipe("gemma4-26b-a4b-nvfp4-dflash").footprint
    assert fp is not None and fp.kv is not None and fp.draft_kv is not None
    return layer_kinds(fp.kv, fp.draft_kv, drafter_sliding_as_full=as_full)


def test_the_recipes_footprint_is_the_measured_runs_shapes() -> None:
    rs = _real_size()
    fp = load_recipe("gemma4-26b-a4b-nvfp4-dflash").footprint
    assert fp is not None
    assert kv_geometry(rs.text_config()) == fp.kv
    assert kv_geometry(rs.dflash_config()) == fp.draft_kv


def test_need_is_what_vllm_said_it_needs() -> None:
    rec = _recorded()
    need = need_bytes(_dflash_kinds(), rec["context"], RECORDED_BATCHED, 2) / GIB
    assert round(need, 2) == rec["need_gib"] == 11.45  # vLLM prints GiB at two decimals
    # the terms that make it: without the drafter's sliding layers allocated as full attention 9.98 GiB, without
    # max-num-batched-tokens in the sliding layers (window only) far less: neither is what vLLM said
    assert round(need_bytes(_dflash_kinds(as_full=False), rec["context"], RECORDED_BATCHED, 2) / GIB, 2) == 9.98
    assert need_bytes(_dflash_kinds(), rec["context"], 1, 2) / GIB < 6.0


def test_longest_context_is_vllms_estimate() -> None:
    rec = _recorded()
    # vLLM printed the available memory rounded to 1.23 GiB: the estimate lies between those of its bounds
    low = longest_context(_dflash_kinds(), int((rec["available_gib"] - 0.005) * GIB), rec["context"],
                          RECORDED_BATCHED, 2)
    high = longest_context(_dflash_kinds(), int((rec["available_gib"] + 0.005) * GIB) - 1, rec["context"],
                           RECORDED_BATCHED, 2)
    assert low <= rec["estimated"] == 5360 <= high
    assert high - low < 64  # tight: one page of the largest layer kind is 16 tokens


def test_sliding_layers_hold_the_window_plus_a_prefill_chunk() -> None:
    kinds = [LayerKind(kv_heads=8, head_dim=256, window=1024, count=1)]
    page = 2 * 8 * 256 * 2 * 16
    # min(1023 + 512, 100000) tokens in blocks of 16, plus one block for a window that starts mid-block
    assert need_bytes(kinds, 100_000, 512, 2) == (-(-1535 // 16) + 1) * page
    # never more than max-model-len
    assert need_bytes(kinds, 100, 512, 2) == (-(-100 // 16) + 1) * page


def test_smaller_pages_hold_more_tokens_per_block() -> None:
    big = LayerKind(kv_heads=8, head_dim=256, window=0, count=1)  # 8 KiB a token: 16 a block
    small = LayerKind(kv_heads=2, head_dim=512, window=8, count=1)  # 4 KiB a token: 32 a block, same page
    page = 8192 * 16
    # the full layer: 33 tokens in 3 blocks; the sliding one: 8 - 1 + 8 tokens in 1 block of 32, plus 1
    assert need_bytes([big, small], 33, 8, 2) == page * (3 + 2)
    odd = LayerKind(kv_heads=3, head_dim=100, window=8, count=1)
    with pytest.raises(ValueError, match="not a whole number"):
        need_bytes([big, odd], 33, 8, 2)


def test_groups_pad_the_smaller_kinds() -> None:
    # 12 sliding + 13 full (vLLM's own example, gpt-oss-20b + EAGLE): groups of 13, the sliding kind padded
    sliding = LayerKind(kv_heads=8, head_dim=64, window=128, count=12)
    full = LayerKind(kv_heads=8, head_dim=64, window=0, count=13)
    page = 2 * 8 * 64 * 2 * 16
    blocks_sliding = -(-min(127 + 64, 1024) // 16) + 1
    assert need_bytes([sliding, full], 1024, 64, 2) == 13 * page * (blocks_sliding + 1024 // 16)
    # 25 sliding + 5 full (Gemma 4): groups of 5, nothing padded
    s25 = LayerKind(kv_heads=8, head_dim=64, window=128, count=25)
    f5 = LayerKind(kv_heads=8, head_dim=64, window=0, count=5)
    assert need_bytes([s25, f5], 1024, 64, 2) == 5 * page * (5 * blocks_sliding + 1024 // 16)
    # 25 sliding + 3 full: groups of 3, the sliding kind in 9 groups (2 padding layers)
    f3 = LayerKind(kv_heads=8, head_dim=64, window=0, count=3)
    assert need_bytes([s25, f3], 1024, 64, 2) == 3 * page * (9 * blocks_sliding + 1024 // 16)


def test_a_drafters_layers_merge_with_equal_target_layers() -> None:
    target = KvGeometry(full_layers=2, full_kv_heads=8, full_head_dim=128)
    drafter = KvGeometry(full_layers=1, full_kv_heads=8, full_head_dim=128, sliding_layers=2, sliding_kv_heads=8,
                         sliding_head_dim=128, sliding_window=64)
    assert layer_kinds(target, drafter, drafter_sliding_as_full=True) == [
        LayerKind(kv_heads=8, head_dim=128, window=0, count=5)]
    assert layer_kinds(target, drafter) == [LayerKind(kv_heads=8, head_dim=128, window=0, count=3),
                                            LayerKind(kv_heads=8, head_dim=128, window=64, count=2)]
    assert need_bytes([], 100, 10, 2) == 0


@pytest.mark.parametrize("pin", sorted(p.name for p in (ROOT / "patches" / "dflash-batched-verification").iterdir()
                                       if p.is_dir()))
def test_sliding_as_full_follows_the_series(pin: str) -> None:
    """The pins whose dflash-batched-verification allocates a DFlash drafter's sliding layers as full attention are
    exactly DFLASH_SLIDING_AS_FULL_PINS: a series change that drops or adds it must change the sizing."""
    text = "".join(p.read_text(encoding="utf-8")
                   for p in sorted((ROOT / "patches" / "dflash-batched-verification" / pin).glob("*.patch")))
    allocates_full = "its KV cache is allocated as full attention" in text and "FullAttentionSpec(" in text
    assert allocates_full == (pin in DFLASH_SLIDING_AS_FULL_PINS)


def _with(name: str, **changes: object) -> Recipe:
    """A shipped recipe with some args changed (None: unset)."""
    recipe = load_recipe(name)
    args = {k: v for k, v in {**recipe.args, **changes}.items() if v is not None}
    return dataclasses.replace(recipe, args=args)


def _vram(recipe: Recipe, **context: object) -> Finding:
    [finding] = [f for f in check(recipe, ctx(**context)) if f.rule == "vram"]
    return finding


RECORDED_ARGS = {"max-model-len": 131072, "max-num-batched-tokens": RECORDED_BATCHED}


def test_the_rule_refuses_what_vllm_refused() -> None:
    """The recorded run's settings: vLLM did not start; the rule says it cannot, whatever the runtime takes."""
    finding = _vram(_with("gemma4-26b-a4b-nvfp4-dflash", **RECORDED_ARGS))
    assert finding.severity == "warning" and "vLLM needs 11.45 GiB of KV cache" in finding.message
    assert "8.7 GiB are left even with no runtime memory at all: vLLM will refuse to start" in finding.message
    assert "the drafter's layers as full attention" in finding.message
    # on the card: 25.6 - 16.5 - 0.44 GiB vLLM loads beside the weights - 7.43 GiB of runtime at 32768 tokens leave
    # 1.23 GiB, vLLM's own figure on the H200, and room for 5344 tokens against vLLM's estimate of 5360
    assert "lower max-model-len to 5344 or less" in finding.hint
    # the shipped settings fit
    shipped = _vram(load_recipe("gemma4-26b-a4b-nvfp4-dflash"))
    assert shipped.severity == "info" and "max-model-len 65536" in shipped.message


def test_within_the_runtime_the_verdict_is_only_likely() -> None:
    finding = _vram(_with("gemma4-26b-a4b-nvfp4-baseline", **{"max-num-batched-tokens": 32768}))
    assert finding.severity == "warning" and "vLLM needs 8.95 GiB" in finding.message
    # 25.6 - 16.0 - 0.44 = 9.16 GiB hold the 8.95 only without the 7.43 GiB vLLM's profile took at 32768 tokens
    assert "runtime 7.4 GiB at max-num-batched-tokens 32768" in finding.message
    assert "1.7 GiB are left after the runtime: vLLM will likely refuse to start" in finding.message


def test_a_recipe_without_a_drafter_counts_no_drafter_layers() -> None:
    alone = dataclasses.replace(_with("gemma4-26b-a4b-nvfp4-dflash", **RECORDED_ARGS), speculative=None)
    finding = _vram(alone)
    assert "vLLM needs 8.95 GiB" in finding.message and "drafter" not in finding.message


def test_with_model_dirs_the_drafters_own_config_counts() -> None:
    """--model-dir: the geometry comes from the checkpoints' configs, the drafter's included (a drafter whose
    layers all read the target's cache holds none)."""
    rs = _real_size()
    recipe = _with("gemma4-26b-a4b-nvfp4-dflash", **RECORDED_ARGS)
    target = checkpoint(kv=kv_geometry(rs.text_config()), weights_bytes=16 * GIB)
    drafter = checkpoint(kv=kv_geometry(rs.dflash_config()), weights_bytes=GIB // 2)
    finding = _vram(recipe, target=target, drafter=drafter)
    assert "vLLM needs 11.45 GiB" in finding.message and "the checkpoint files" in finding.message
    shared = checkpoint(kv=kv_geometry({**rs.dflash_config(), "num_kv_shared_layers": 5}), weights_bytes=GIB // 2)
    assert "vLLM needs 8.95 GiB" in _vram(recipe, target=target, drafter=shared).message


def test_an_mtp_assistant_checkpoint_holds_no_kv_of_its_own() -> None:
    rs = _real_size()
    recipe = _with("gemma4-26b-a4b-nvfp4-mtp", **{"max-num-batched-tokens": 32768})
    target = checkpoint(kv=kv_geometry(rs.text_config()), weights_bytes=16 * GIB)
    assistant = checkpoint(kv=kv_geometry(rs.dflash_config()), weights_bytes=GIB // 2)  # any layers: not counted
    assert "vLLM needs 8.95 GiB" in _vram(recipe, target=target, drafter=assistant).message


def test_on_a_pin_that_keeps_the_drafters_windows_they_count_as_sliding() -> None:
    recipe = dataclasses.replace(_with("gemma4-26b-a4b-nvfp4-dflash", **RECORDED_ARGS), pin="vllm-0.33.0")
    finding = _vram(recipe, pin=load_pins().get("vllm-0.33.0"))
    assert "vLLM needs 9.98 GiB" in finding.message and "drafter's layers as full" not in finding.message


def test_one_attention_type_is_neither_unified_nor_padded() -> None:
    # all full attention, two shapes: each layer at its own page (vLLM's uniform-type path), no padding
    a = LayerKind(kv_heads=8, head_dim=128, window=0, count=3)
    b = LayerKind(kv_heads=2, head_dim=128, window=0, count=1)
    assert need_bytes([a, b], 100, 8, 2) == (3 * 4096 + 1 * 1024) * 7 * 16


def test_unset_batched_tokens_take_vllm_serves_default() -> None:
    """vLLM 0.21.0's `vllm serve` default (engine/arg_utils.py): 2048 below 70 GiB, 8192 from it; without
    chunked prefill at least max-model-len."""
    small = _with("gemma4-26b-a4b-nvfp4-baseline", **{"max-num-batched-tokens": None})
    assert "vLLM serve's default on a 32 GB card, 2048" in _vram(small).message
    big = dataclasses.replace(small, hardware=dataclasses.replace(small.hardware, vram_gb=96))
    assert "vLLM serve's default on a 96 GB card, 8192" in _vram(big).message
    off = _vram(_with("gemma4-26b-a4b-nvfp4-baseline", **{"max-num-batched-tokens": None,
                                                          "enable-chunked-prefill": False})).message
    # a 131072-token step's activations (the measured line, extrapolated) leave nothing for the KV cache
    assert "chunked prefill off: at least max-model-len, 131072" in off and "max-num-batched-tokens 131072" in off
    assert "No available memory for the cache blocks" in off
    assert "unset" not in _vram(load_recipe("gemma4-26b-a4b-nvfp4-baseline")).message  # set: nothing assumed


def test_counts_written_with_vllms_suffixes_are_read_as_vllm_reads_them() -> None:
    """'128k' / '32k' (what vLLM's human-readable parsers take, and --set keeps as text) are sized, not taken
    for unset: 32k read as vLLM serve's default 2048 would hide most of the sliding layers' chunk."""
    plain = _vram(_with("gemma4-26b-a4b-nvfp4-dflash", **{"max-model-len": 128000, "max-num-batched-tokens": 32000}))
    human = _vram(_with("gemma4-26b-a4b-nvfp4-dflash", **{"max-model-len": "128k", "max-num-batched-tokens": "32k"}))
    assert human.message == plain.message and "max-model-len 128000" in human.message
    binary = _vram(_with("gemma4-26b-a4b-nvfp4-dflash", **{"max-model-len": "128K", "max-num-batched-tokens": "32K"}))
    assert "vLLM needs 11.45 GiB" in binary.message  # 131072 / 32768, the recorded run's
