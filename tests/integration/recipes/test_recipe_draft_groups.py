"""`recipe check` on a DFlash drafter's layer count against the target's KV cache grouping on vLLM 0.21.0 (third
review, 6): the rule's arithmetic against the 0.21.0 tree's own get_kv_cache_groups, and what it says for each
drafter size beside Gemma 4 26B-A4B (25 sliding + 5 full layers)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from tests.support.tree_probe import run_tree_probe
from tests.support.trees import sdist_tree

from g4build.pins.model import load_pins
from g4build.recipes import load_recipe
from g4build.recipes.checkpoint import CheckpointInfo
from g4build.recipes.draft_groups import kv_groups
from g4build.recipes.model import KvGeometry
from g4build.recipes.rules import CheckContext, check
from g4build.series.model import load_all

TARGET_KV = KvGeometry(full_layers=5, full_kv_heads=2, full_head_dim=512, sliding_layers=25, sliding_kv_heads=8,
                       sliding_head_dim=256, sliding_window=1024)
SMALL_KV = dataclasses.replace(TARGET_KV, full_layers=10, sliding_layers=4)


def _info(path: str, kv: KvGeometry) -> CheckpointInfo:
    return CheckpointInfo(path=path, architectures=("X",), model_type="gemma4", quant_method=None, quant_algo=None,
                          head_dim=128, global_head_dim=None, kv=kv, weights_bytes=0)


def _drafter(layers: int, heads: int = 2, head_dim: int = 128) -> CheckpointInfo:
    sliding = max(0, layers - 1)
    return dataclasses.replace(_info("drafter", KvGeometry(
        full_layers=layers - sliding, full_kv_heads=heads, full_head_dim=head_dim, sliding_layers=sliding,
        sliding_kv_heads=heads, sliding_head_dim=head_dim, sliding_window=2048)), head_dim=head_dim)


def _findings(layers: int, pin: str = "vllm-0.21.0", drafter: CheckpointInfo | None = None,
              target: KvGeometry = TARGET_KV) -> list[tuple[str, str]]:
    pins = load_pins()
    ctx = CheckContext(pin=pins.get(pin), known_pins=tuple(pins.pins), series=tuple(load_all()),
                       target=_info("target", target), drafter=drafter or _drafter(layers))
    recipe = load_recipe("gemma4-26b-a4b-nvfp4-dflash")
    recipe = dataclasses.replace(recipe, pin=pin)
    return [(f.severity, f.message) for f in check(recipe, ctx) if f.rule == "draft-groups"]


@pytest.mark.network  # the pinned sdist (cached after the first run)
def test_rule_matches_the_trees_own_grouping(tmp_path: Path) -> None:
    facts = run_tree_probe(Path(__file__).parent / "draft_grouping_probe.py", sdist_tree("vllm-0.21.0"), tmp_path,
                           "DRAFT_GROUPING", [])
    for n in range(1, 9):
        grouping = kv_groups([25, 5, n])
        assert (facts[str(n)]["groups"], facts[str(n)]["draft_groups"], facts[str(n)]["size"]) == (
            grouping.total, grouping.groups[-1], grouping.size), n
    # the review's figures: 1 layer -> 31 groups, 2 -> 17, 3 -> 12; 5 fits (7); 6 splits the drafter
    assert [facts[str(n)]["groups"] for n in (1, 2, 3, 5)] == [31, 17, 12, 7]
    assert facts["6"]["draft_groups"] == 2
    # a drafter of the target's full-layer spec joins that kind (fourth review, 7): the rule refuses exactly where
    # the tree splits it, and warns where the joined kind adds groups
    for n in range(1, 9):
        joined = facts[f"joined-{n}"]
        said = _findings(n, drafter=_drafter(n, heads=2, head_dim=512))
        assert [s for s, _ in said if s == "error"] == (["error"] if joined["draft_groups"] > 1 else []), (n, said)
        grouping = kv_groups([25, 5 + n])
        assert (joined["groups"], joined["size"]) == (grouping.total, grouping.size), n
        padded = joined["groups"] * joined["size"] > 30 + n  # the target alone: 6 groups of 5, no padding
        assert bool(said) is (joined["draft_groups"] > 1 or padded), (n, joined, said)
    assert facts["split"]["draft_groups"] == 2
    assert [s for s, _ in _findings(2, drafter=_drafter(2, heads=2, head_dim=512), target=SMALL_KV)] == ["error"]


def test_check_refuses_split_drafters_and_warns_on_small_ones() -> None:
    assert _findings(5) == []  # the published Gemma 4 drafters: 4 sliding + 1 full
    (severity, message), = _findings(6)
    assert severity == "error" and "split over 2 KV cache groups" in message
    for n, groups in ((1, 31), (2, 17), (3, 12)):
        (severity, message), = _findings(n)
        assert severity == "warning" and f"{groups} groups instead of 7" in message, message
    assert _findings(6, "vllm-0.33.0") == []  # later pins group (or refuse) drafters themselves


def test_a_drafter_of_the_full_layers_spec_is_counted_with_them() -> None:
    """Beside 26B-A4B its layers join the 5 full layers: that kind stays one group (the drafter whole) and sets the
    group size, padding the sliding kind; beside a target whose full layers are the larger kind, the joined kind is
    split and the drafter with it."""
    for n, groups, size, padding in ((1, 6, 6, 5), (2, 5, 7, 3), (5, 4, 10, 5)):
        (severity, message), = _findings(n, drafter=_drafter(n, heads=2, head_dim=512))
        assert severity == "warning" and "join the target's full-attention layers" in message, message
        assert f"{groups} KV cache groups of {size} layers" in message and f"{padding} padding layers" in message
    assert _findings(5, drafter=_drafter(5, heads=2, head_dim=512)) != _findings(5)  # head dim 128: its own kind
    (severity, message), = _findings(2, drafter=_drafter(2, heads=2, head_dim=512), target=SMALL_KV)
    assert severity == "error" and "same KV spec as the target's 10 full-attention layers" in message


def _write_config(folder: Path, config: dict[str, object]) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.mark.parametrize(("layers", "code", "said"), [(5, 0, None), (6, 11, "split over 2 KV cache groups"),
                                                     (2, 0, "17 groups instead of 7")])
def test_recipe_check_reads_the_drafters_config_for_it(tmp_path: Path, layers: int, code: int,
                                                        said: str | None) -> None:
    """End to end: `recipe check --model-dir --draft-dir` reads both config.json files (a 26B-A4B-shaped target,
    the published drafters' [S,...,S,F] layout) and says what the 0.21.0 grouping does with the drafter."""
    from tests.integration.recipes.conftest import g4build

    pattern = (["sliding_attention"] * 5 + ["full_attention"]) * 5
    target = _write_config(tmp_path / "target", {
        "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
        "text_config": {"num_hidden_layers": 30, "layer_types": pattern, "num_key_value_heads": 8,
                        "num_global_key_value_heads": 2, "attention_k_eq_v": True, "head_dim": 256,
                        "global_head_dim": 512, "sliding_window": 1024}})
    drafter = _write_config(tmp_path / "drafter", {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": layers,
        "layer_types": ["sliding_attention"] * (layers - 1) + ["full_attention"], "num_key_value_heads": 8,
        "head_dim": 128, "sliding_window": 2048})
    done = g4build("recipe", "check", "gemma4-26b-a4b-nvfp4-dflash", "--model-dir", str(target), "--draft-dir",
                   str(drafter), "--json")
    assert done.returncode == code, done.stdout + done.stderr
    found = [f for f in json.loads(done.stdout)["findings"] if f["rule"] == "draft-groups"]
    assert [f["message"] for f in found if said and said in f["message"]] == [f["message"] for f in found]
    assert len(found) == (0 if said is None else 1)
