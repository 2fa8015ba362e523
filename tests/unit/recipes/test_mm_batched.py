"""The mm-batched rule: Gemma 4 takes a multimodal item in one step, so vLLM refuses to start with
max-num-batched-tokens below the largest item of an enabled modality. The recorded refusals (the card-fit way-out
runs at 2048) are held in test_vram_measured.py; here the rule's arithmetic, the options it reads, vLLM serve's
default per pin, and the figures against each pin's own source (the registry sdists, cached)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from tests.support.trees import sdist_tree
from tests.unit.recipes.test_recipe_rules import checkpoint

from g4build.pins.model import load_pins
from g4build.recipes import load_recipe
from g4build.recipes.findings import Finding
from g4build.recipes.mm_batched import (
    DEFAULT_RAISED_TO_MM_ITEM_PINS,
    IMAGE_SOFT_TOKENS,
    VIDEO_FRAME_TOKENS,
    VIDEO_MAX_FRAMES,
    mm_floor,
)
from g4build.recipes.rules import check

from .test_recipe_rules import ctx

ALL_PINS = load_pins()
PINS = ("vllm-0.21.0", "vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0")


def _recipe(vram: float = 32, pin: str = "vllm-0.21.0", **args: Any) -> Any:
    recipe = load_recipe("gemma4-26b-a4b-nvfp4-dflash")
    merged = {k: v for k, v in {**recipe.args, **args}.items() if v is not None}
    return dataclasses.replace(recipe, args=merged, pin=pin,
                               hardware=dataclasses.replace(recipe.hardware, vram_gb=vram))


def _ctx(recipe: Any) -> Any:
    return ctx(pin=ALL_PINS.get(recipe.pin))


def _mm(recipe: Any) -> list[Finding]:
    return [f for f in check(recipe, _ctx(recipe)) if f.rule == "mm-batched"]


def test_below_the_video_item_vllm_refuses_and_the_hint_names_both_ways() -> None:
    [f] = _mm(_recipe(**{"max-num-batched-tokens": 2048}))
    assert f.severity == "error"
    assert "max_tokens_per_mm_item (2496) is larger than max_num_batched_tokens (2048)" in f.message
    assert "--set args.max-num-batched-tokens=2496" in (f.hint or "")
    assert 'limit-mm-per-prompt={"video": 0}' in (f.hint or "") and "280 tokens" in (f.hint or "")
    assert not _mm(_recipe(**{"max-num-batched-tokens": 2496}))  # exactly one item's worth is enough
    assert _mm(_recipe(**{"max-num-batched-tokens": 2495}))


@pytest.mark.parametrize(("limit", "floor"), [
    ({"video": 0}, (280, "image")),
    ('{"video": 0}', (280, "image")),  # as --set writes it: JSON text
    ({"video": {"count": 1, "num_frames": 8}}, (8 * 78, "video")),
    ({"video": {"count": 1, "num_frames": 64}}, (2496, "video")),  # vLLM samples 32 frames at most
    ({"video": {"count": 0}}, (280, "image")),
    ({"image": 2}, (2496, "video")),  # a modality left out of the option keeps vLLM's limit: counted
    ({"image": 0, "video": 0}, None),
    ({"video": True}, (2496, "video")),  # not a count vLLM reads as 0: counted
    ("not json", (2496, "video")),
])
def test_limit_mm_per_prompt_decides_which_items_count(limit: Any, floor: tuple[int, str] | None) -> None:
    assert mm_floor(_recipe(**{"limit-mm-per-prompt": limit}), ctx()) == floor


def test_larger_images_and_text_only_and_other_models() -> None:
    big = _recipe(**{"limit-mm-per-prompt": {"video": 0}, "mm-processor-kwargs": {"max_soft_tokens": 1120},
                     "max-num-batched-tokens": 1024})
    [f] = _mm(big)
    assert "largest image item, 1120 tokens" in f.message and "limit-mm-per-prompt" not in (f.hint or "")
    # a max_soft_tokens vLLM does not support is not taken (it keeps the vision config's)
    odd = _recipe(**{"limit-mm-per-prompt": {"video": 0}, "mm-processor-kwargs": {"max_soft_tokens": 1000}})
    assert mm_floor(odd, ctx()) == (IMAGE_SOFT_TOKENS, "image")
    assert mm_floor(_recipe(**{"language-model-only": True}), ctx()) is None
    other = dataclasses.replace(_recipe(**{"max-num-batched-tokens": 512}), family="llama", model="./models/llama")
    assert mm_floor(other, ctx()) is None and not _mm(other)


@pytest.mark.parametrize("pin", PINS)
def test_an_unset_max_num_batched_tokens_is_vllm_serves_default_for_the_pin(pin: str) -> None:
    """vLLM serve: 2048 under 70 GiB; 0.26.0 and later raise it to Gemma 4's largest item (2496), 0.21.0 does not
    and refuses; 8192 from 70 GiB; without chunked prefill max-model-len."""
    small = _recipe(32, pin, **{"max-num-batched-tokens": None})
    raised = pin in DEFAULT_RAISED_TO_MM_ITEM_PINS
    assert bool(_mm(small)) is not raised
    vram = next(f for f in check(small, _ctx(small)) if f.rule == "vram")
    assert ("raised to Gemma 4's largest multimodal item, 2496" in vram.message) is raised
    assert not _mm(_recipe(96, pin, **{"max-num-batched-tokens": None}))
    assert not _mm(_recipe(32, pin, **{"max-num-batched-tokens": None, "enable-chunked-prefill": False}))


def test_the_way_out_never_names_a_step_vllm_refuses() -> None:
    """The VRAM rule's way out on a card too small stops at the floor: 2496 with video, 2048 without."""
    for name in ("gemma4-26b-a4b-nvfp4-dflash", "gemma4-26b-a4b-nvfp4-mtp"):
        recipe = load_recipe(name)
        small = dataclasses.replace(recipe, hardware=dataclasses.replace(recipe.hardware, vram_gb=24))
        hint = next(f for f in check(small, ctx()) if f.rule == "vram").hint or ""
        named = [int(b) for b in re.findall(r"max-num-batched-tokens (\d+),", hint)]
        assert named == [2496], hint


@pytest.mark.network  # the pins' sdists (cached after once)
@pytest.mark.parametrize("pin", PINS)
def test_the_figures_are_each_pins_own(pin: str) -> None:
    """gemma4_mm.py's video item (frames x (soft tokens + 2 + 6)), the refusal in encoder_cache_manager.py, Gemma 4
    forced to whole items on CUDA (platforms/cuda.py), and arg_utils.py raising the default where listed."""
    tree = sdist_tree(pin)
    mm = (tree / "vllm" / "model_executor" / "models" / "gemma4_mm.py").read_text(encoding="utf-8")
    assert f"_VIDEO_MAX_FRAMES = {VIDEO_MAX_FRAMES} " in mm
    assert re.search(r"_VIDEO_MAX_SOFT_TOKENS = (\d+) ", mm).group(1) == str(VIDEO_FRAME_TOKENS - 8)  # type: ignore[union-attr]
    assert "num_frames * (_VIDEO_MAX_SOFT_TOKENS + 2 + 6)" in mm
    assert "default_output_length" in mm and "_SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)" in mm
    budget = (tree / "vllm" / "v1" / "core" / "encoder_cache_manager.py").read_text(encoding="utf-8")
    assert "Chunked MM input disabled but max_tokens_per_mm_item" in budget
    cuda = (tree / "vllm" / "platforms" / "cuda.py").read_text(encoding="utf-8")
    assert "is_mm_prefix_lm" in cuda and "disable_chunked_mm_input = True" in cuda
    args = (tree / "vllm" / "engine" / "arg_utils.py").read_text(encoding="utf-8")
    assert ("_get_min_mm_batched_tokens" in args) is (pin in DEFAULT_RAISED_TO_MM_ITEM_PINS)


def test_every_pin_is_decided() -> None:
    """A new pin must say whether its vLLM serve raises the default (test_the_figures_are_each_pins_own reads it)."""
    assert set(PINS) == set(ALL_PINS.pins)


def test_a_checkpoint_read_decides_whether_items_are_whole() -> None:
    """With --model-dir the checkpoint says it: a multimodal Gemma 4 whose image tokens attend both ways gets the
    floor; Gemma4ForCausalLM (text only) and one without use_bidirectional_attention "vision" do not (vLLM's
    is_mm_prefix_lm, model_arch_config_convertor.py)."""
    recipe = _recipe(**{"max-num-batched-tokens": 2048})
    pin = ALL_PINS.get(recipe.pin)
    mm = checkpoint(mm_prefix=True)
    assert [f.rule for f in check(recipe, ctx(pin=pin, target=mm)) if f.severity == "error"] == ["mm-batched"]
    for text_only in (checkpoint(mm_prefix=False), checkpoint(architectures=("Gemma4ForCausalLM",),
                                                              model_type="gemma4_text")):
        assert not [f for f in check(recipe, ctx(pin=pin, target=text_only)) if f.rule == "mm-batched"]


def test_read_checkpoint_sees_the_bidirectional_vision_attention(tmp_path: Path) -> None:
    import json

    from g4build.recipes.checkpoint import read_checkpoint

    def folder(name: str, config: dict[str, Any]) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config), encoding="utf-8")
        return d

    text = {"model_type": "gemma4_text", "use_bidirectional_attention": "vision"}
    mm = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
          "vision_config": {"default_output_length": 280}}
    assert read_checkpoint(folder("mm", mm)).mm_prefix is True
    assert read_checkpoint(folder("causal", {**text, "architectures": ["Gemma4ForCausalLM"]})).mm_prefix is False
    plain = {**mm, "text_config": {**text, "use_bidirectional_attention": None}}
    assert read_checkpoint(folder("plain", plain)).mm_prefix is False
    odd = {**mm, "architectures": "Gemma4ForConditionalGeneration"}  # not a list: no architectures, no floor
    assert read_checkpoint(folder("odd", odd)).mm_prefix is False


@pytest.mark.parametrize(("pin", "args", "refused"), [
    # chunked prefill off and max-model-len unset: vLLM takes the model's maximum context, far above any item
    ("vllm-0.21.0", {"enable-chunked-prefill": False, "max-model-len": None}, False),
    # off with a short context: 0.21.0 takes max(2048, 2048); 0.26.0+ raise it to the item after that max
    ("vllm-0.21.0", {"enable-chunked-prefill": False, "max-model-len": 2048}, True),
    ("vllm-0.26.0", {"enable-chunked-prefill": False, "max-model-len": 2048}, False),
    ("vllm-0.33.0", {"enable-chunked-prefill": False, "max-model-len": 2048}, False),
    # performance-mode throughput doubles serve's default: 4096 clears the video item on 0.21.0
    ("vllm-0.21.0", {"performance-mode": "throughput"}, False),
    # the clamp to max-num-seqs x max-model-len comes last, on every pin
    ("vllm-0.26.0", {"max-num-seqs": 1, "max-model-len": 2048}, True),
    ("vllm-0.26.0", {"max-num-seqs": 2, "max-model-len": 2048}, False),
])
def test_an_unset_value_follows_arg_utils_order(pin: str, args: dict[str, Any], refused: bool) -> None:
    recipe = _recipe(24, pin, **{"max-num-batched-tokens": None, **args})
    assert bool(_mm(recipe)) is refused


def test_embeddings_keep_every_modality_in_the_budget() -> None:
    """With enable-mm-embeds vLLM budgets a modality limited to 0 too (encoder_budget.py, embed_only_modalities):
    video 0 or language-model-only no longer lower the floor, and the hint does not offer them."""
    for extra in ({"limit-mm-per-prompt": {"video": 0}}, {"language-model-only": True}):
        [f] = _mm(_recipe(**{"max-num-batched-tokens": 2048, "enable-mm-embeds": True, **extra}))
        assert "2496" in f.message and "limit-mm-per-prompt" not in (f.hint or "")


def test_max_soft_tokens_under_images_kwargs_is_read() -> None:
    nested = _recipe(**{"limit-mm-per-prompt": {"video": 0},
                        "mm-processor-kwargs": {"images_kwargs": {"max_soft_tokens": 1120}}})
    assert mm_floor(nested, _ctx(nested)) == (1120, "image")


def test_a_recipe_already_below_the_floor_is_shown_the_way_out_from_the_floor() -> None:
    """On a card with no room, the VRAM rule's way out never names the refused value the recipe holds, and stops
    advising a smaller prefill chunk at the floor."""
    recipe = _recipe(22, **{"max-num-batched-tokens": 2048})
    vram = next(f for f in check(recipe, _ctx(recipe)) if f.rule == "vram")
    named = [int(b) for b in re.findall(r"max-num-batched-tokens (\d+),", vram.hint or "")]
    assert named == [2496] and "lower max-num-batched-tokens" not in (vram.hint or "")
