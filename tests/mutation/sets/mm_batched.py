"""Gemma 4's multimodal floor under max-num-batched-tokens (mm_batched.py): which items count, vLLM serve's
default per pin, the rule's comparison, and the VRAM rule's way out stopping at the floor."""

from __future__ import annotations

from run_mutations import PKG, Mutation

MM = f"{PKG}/recipes/mm_batched.py"
TESTS = ("tests/unit/recipes/test_mm_batched.py", "tests/unit/recipes/test_vram_measured.py")

M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    M("mm-limits-ignored", MM, 'limits = {} if limits_aside else (_option(recipe, "limit-mm-per-prompt") or {})',
      "limits = {}", TESTS, "limit-mm-per-prompt's video 0 is not read: the floor stays at the video item"),
    M("mm-floor-strict", MM, "    if batched >= tokens:", "    if batched > tokens:", TESTS,
      "exactly one item's worth of tokens is refused, though vLLM starts with it"),
    M("mm-frames-unclamped", MM, "tokens = min(frames, VIDEO_MAX_FRAMES) * VIDEO_FRAME_TOKENS",
      "tokens = frames * VIDEO_FRAME_TOKENS", TESTS, "num_frames above vLLM's 32 raise the floor past vLLM's"),
    M("mm-raise-every-pin", MM, "if _pin(recipe, ctx) in DEFAULT_RAISED_TO_MM_ITEM_PINS and raised > default:",
      "if raised > default:", TESTS, "0.21.0's unset default is taken as raised: its refusal goes unsaid"),
    M("mm-raise-no-pin", MM, "if _pin(recipe, ctx) in DEFAULT_RAISED_TO_MM_ITEM_PINS and raised > default:",
      "if False:", TESTS, "0.26.0 and later are said to refuse what their raised default starts"),
    M("mm-count-falsy", MM, "        if count == 0:", "        if not count:", TESTS,
      "a limit vLLM does not read as 0 (true, a dict without a count) drops the modality"),
    M("mm-json-text", MM, "            value = json.loads(value)", "            return None", TESTS,
      "a --set written as JSON text is not read"),
    M("mm-text-only", MM, ' or recipe.args.get("language-model-only") is True', "", TESTS,
      "language-model-only still gets a multimodal floor"),
    M("mm-way-out-floor", f"{PKG}/recipes/vram.py", "{max(b, floor) for b in (4096, 2048)}",
      "{b for b in (4096, 2048)}", TESTS, "the way out names max-num-batched-tokens 2048, which vLLM refused"),
)
