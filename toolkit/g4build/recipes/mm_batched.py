"""max-num-batched-tokens as vLLM takes it, and the floor Gemma 4's multimodal items put under it.

vLLM turns chunked multimodal input off for a model whose image tokens attend bidirectionally (Gemma 4:
``is_mm_prefix_lm``; ``platforms/cuda.py`` on every pin), and then refuses to start when one item of an enabled
modality is longer than max-num-batched-tokens (``v1/core/encoder_cache_manager.py``,
``compute_mm_encoder_budget``): "Chunked MM input disabled but max_tokens_per_mm_item (2496) is larger than
max_num_batched_tokens (2048)". Gemma 4's items (``gemma4_mm.py``, ``get_mm_max_tokens_per_item``, the same at
0.21.0, 0.26.0, 0.29.0 and 0.33.0): an image is its ``max_soft_tokens`` (the vision config's
``default_output_length``, 280 in the published checkpoints, or ``mm-processor-kwargs``' ``max_soft_tokens``); a
video 32 frames of 70 soft tokens and 8 markers, 2,496 (fewer frames where ``limit-mm-per-prompt`` says
``num_frames``). A modality whose ``limit-mm-per-prompt`` count is 0 is not counted (``multimodal/
encoder_budget.py``). Found on the H200: the card-fit runs with max-num-batched-tokens 2048
(``tests/gpu/results/vllm-0.21.0-card-fit.json``). Gemma 4 checkpoints with an audio tower (E2B, E4B) add audio,
whose items are shorter than a video; the recipes serve none.

With max-num-batched-tokens unset, ``vllm serve`` takes 8192 on a GPU of 70 GiB or more and 2048 below
(``engine/arg_utils.py``), at least max-model-len without chunked prefill; 0.26.0 and later raise that default to
the largest item of any modality the model supports, limits aside (``_get_min_mm_batched_tokens``); 0.21.0 does
not, and refuses.
"""

from __future__ import annotations

import json
from typing import Any

from g4build.recipes.counts import int_arg
from g4build.recipes.findings import CheckContext, Finding, is_gemma4, serving_pin
from g4build.recipes.model import Recipe

LARGE_GPU_GIB, SERVE_BATCHED_LARGE, SERVE_BATCHED_SMALL = 70, 8192, 2048  # vLLM serve's max-num-batched-tokens
VIDEO_MAX_FRAMES, VIDEO_FRAME_TOKENS = 32, 70 + 2 + 6  # gemma4_mm.py: soft tokens a frame, markers, timestamp
IMAGE_SOFT_TOKENS, SUPPORTED_SOFT_TOKENS = 280, (70, 140, 280, 560, 1120)
DEFAULT_RAISED_TO_MM_ITEM_PINS = ("vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0")  # arg_utils.py raises the default


def _option(recipe: Recipe, name: str) -> dict[str, Any] | None:
    """A JSON-object option (written as a mapping in YAML or as JSON text by --set); None when unset or not one."""
    value: Any = recipe.args.get(name)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _image_tokens(recipe: Recipe) -> int:
    """An image's soft tokens: mm-processor-kwargs' max_soft_tokens, top level or under images_kwargs (vLLM's
    _get_max_soft_tokens), where vLLM supports the value; else the vision config's default_output_length."""
    kwargs = _option(recipe, "mm-processor-kwargs") or {}
    images = kwargs.get("images_kwargs")
    soft = kwargs.get("max_soft_tokens", images.get("max_soft_tokens") if isinstance(images, dict) else None)
    return soft if isinstance(soft, int) and not isinstance(soft, bool) and soft in SUPPORTED_SOFT_TOKENS \
        else IMAGE_SOFT_TOKENS


def _count_and_frames(limit: Any) -> tuple[int | None, int | None]:
    """A limit-mm-per-prompt entry: a count, or vLLM's dummy options ({"count": N, "num_frames": F, ...})."""
    if isinstance(limit, bool):
        return None, None
    if isinstance(limit, int):
        return limit, None
    if isinstance(limit, dict):
        count, frames = limit.get("count", 1), limit.get("num_frames")
        return (count if isinstance(count, int) and not isinstance(count, bool) else None,
                frames if isinstance(frames, int) and not isinstance(frames, bool) and frames > 0 else None)
    return None, None


def _takes_whole_items(recipe: Recipe, ctx: CheckContext) -> bool:
    """A target vLLM serves with chunked multimodal input off: a checkpoint read says so itself (a multimodal
    Gemma 4 whose image tokens attend both ways); without one, the recipe's Gemma 4 family (its checkpoints are)."""
    if ctx.target is not None:
        return ctx.target.mm_prefix
    return is_gemma4(recipe, ctx)


def mm_items(recipe: Recipe, ctx: CheckContext, *, counts_aside: bool = False) -> dict[str, int]:
    """Tokens of the largest item of each modality vLLM counts: those whose limit-mm-per-prompt count is not 0
    (with enable-mm-embeds every one: embeddings need the budget too), or every one ``counts_aside`` (the 0.26+
    default raise, which still reads the video's num_frames). None for a model that chunks its items, or with
    language-model-only and no embeddings."""
    embeds = recipe.args.get("enable-mm-embeds") is True
    if not _takes_whole_items(recipe, ctx) or (recipe.args.get("language-model-only") is True and not embeds):
        return {}
    limits = _option(recipe, "limit-mm-per-prompt") or {}
    items = {"image": _image_tokens(recipe), "video": VIDEO_MAX_FRAMES * VIDEO_FRAME_TOKENS}
    out = {}
    for modality, tokens in items.items():
        count, frames = _count_and_frames(limits.get(modality, 1))
        if count == 0 and not (counts_aside or embeds):
            continue
        if modality == "video" and frames is not None:
            tokens = min(frames, VIDEO_MAX_FRAMES) * VIDEO_FRAME_TOKENS
        out[modality] = tokens
    return out


def serve_batched_tokens(recipe: Recipe, ctx: CheckContext, max_len: int) -> tuple[int, str]:
    """max-num-batched-tokens as vLLM will have it, and what was assumed when the recipe leaves it unset ("" when
    set), in
    arg_utils.py's order: serve's default for the card, doubled by performance-mode throughput, at least
    max-model-len without chunked prefill, raised to Gemma 4's largest item on 0.26.0 and later, at most
    max-num-seqs x max-model-len (where both are set)."""
    batched = int_arg(recipe, "max-num-batched-tokens")
    if batched is not None:
        return batched, ""
    vram = recipe.hardware.vram_gb
    value = SERVE_BATCHED_LARGE if vram >= LARGE_GPU_GIB else SERVE_BATCHED_SMALL
    why = [f"vLLM serve's default on a {vram:g} GB card, {value}"]
    if recipe.args.get("performance-mode") == "throughput":
        value *= 2
        why.append(f"doubled for performance-mode throughput, {value}")
    if recipe.args.get("enable-chunked-prefill") is False:
        value = max(max_len, value)
        why.append(f"chunked prefill off: at least max-model-len, {value}")
    raised = max(mm_items(recipe, ctx, counts_aside=True).values(), default=0)
    if serving_pin(recipe, ctx) in DEFAULT_RAISED_TO_MM_ITEM_PINS and raised > value:
        value = raised
        why.append(f"raised to Gemma 4's largest multimodal item, {raised}")
    seqs, length = int_arg(recipe, "max-num-seqs"), int_arg(recipe, "max-model-len")
    if seqs is not None and length is not None and seqs * length < value:
        value = seqs * length
        why.append(f"at most max-num-seqs x max-model-len, {value}")
    return value, "max-num-batched-tokens unset: " + ", ".join(why)


def mm_floor(recipe: Recipe, ctx: CheckContext) -> tuple[int, str] | None:
    """The fewest max-num-batched-tokens vLLM starts with, and the modality that sets it; None: no floor."""
    items = mm_items(recipe, ctx)
    if not items:
        return None
    modality = max(items, key=lambda m: (items[m], m))
    return items[modality], modality


def rule_mm_batched(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    floor = mm_floor(recipe, ctx)
    if floor is None:
        return []
    tokens, modality = floor
    max_len = int_arg(recipe, "max-model-len")
    unset = int_arg(recipe, "max-num-batched-tokens") is None
    if unset and recipe.args.get("enable-chunked-prefill") is False and max_len is None:
        return []  # vLLM takes the model's own maximum context, not known here: far above any item
    batched, assumed = serve_batched_tokens(recipe, ctx, max_len or 0)
    if batched >= tokens:
        return []
    image = mm_items(recipe, ctx).get("image")
    leave_out = (f", or leave video out (--set 'args.limit-mm-per-prompt={{\"video\": 0}}': then an image, {image} "
                 "tokens, is the largest item)" if modality == "video" and image is not None and image <= batched
                 and recipe.args.get("enable-mm-embeds") is not True else "")
    return [Finding(rule="mm-batched", severity="error",
                    message=f"max-num-batched-tokens {batched}{f' ({assumed})' if assumed else ''} is less "
                            f"than Gemma 4's largest {modality} "
                            f"item, {tokens} tokens: vLLM takes a multimodal item in one step for this model and "
                            "refuses to start (\"Chunked MM input disabled but max_tokens_per_mm_item "
                            f"({tokens}) is larger than max_num_batched_tokens ({batched})\")",
                    hint=f"--set args.max-num-batched-tokens={tokens} or more{leave_out}")]
