"""Gemma 4's multimodal floor under max-num-batched-tokens (mm_batched.py): which items count, vLLM serve's
default per pin, the rule's comparison, and the VRAM rule's way out stopping at the floor."""

from __future__ import annotations

from run_mutations import PKG, Mutation

MM = f"{PKG}/recipes/mm_batched.py"
TESTS = ("tests/unit/recipes/test_mm_batched.py", "tests/unit/recipes/test_vram_measured.py")

M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    M("mm-limits-ignored", MM, 'limits = _option(recipe, "limit-mm-per-prompt") or {}', "limits = {}", TESTS,
      "limit-mm-per-prompt's video 0 is not read: the floor stays at the video item"),
    M("mm-embeds-ignored", MM, "        if count == 0 and not (counts_aside or embeds):",
      "        if count == 0 and not counts_aside:", TESTS,
      "with enable-mm-embeds a modality limited to 0 is dropped, though vLLM still budgets it"),
    M("mm-any-gemma4-checkpoint", MM, "        return ctx.target.mm_prefix", "        return ctx.target.is_gemma4",
      TESTS, "a text-only Gemma 4 checkpoint (Gemma4ForCausalLM) gets the multimodal floor"),
    M("mm-throughput-ignored", MM, '    if recipe.args.get("performance-mode") == "throughput":', "    if False:",
      TESTS, "performance-mode throughput's doubled default is not taken: a false refusal on 0.21.0"),
    M("mm-no-clamp", MM, "    if seqs is not None and length is not None and seqs * length < value:",
      "    if False:", TESTS, "vLLM's clamp to max-num-seqs x max-model-len is not applied"),
    M("mm-chunked-off-unknown", MM, "        return []  # vLLM takes the model's own maximum context",
      "        pass  # vLLM takes the model's own maximum context", TESTS,
      "chunked prefill off with max-model-len unset is refused, though vLLM takes the model's maximum"),
    M("mm-images-kwargs", MM,
      'soft = kwargs.get("max_soft_tokens", images.get("max_soft_tokens") if isinstance(images, dict) else None)',
      'soft = kwargs.get("max_soft_tokens")', TESTS, "max_soft_tokens under images_kwargs is not read"),
    M("mm-floor-strict", MM, "    if batched >= tokens:", "    if batched > tokens:", TESTS,
      "exactly one item's worth of tokens is refused, though vLLM starts with it"),
    M("mm-frames-unclamped", MM, "tokens = min(frames, VIDEO_MAX_FRAMES) * VIDEO_FRAME_TOKENS",
      "tokens = frames * VIDEO_FRAME_TOKENS", TESTS, "num_frames above vLLM's 32 raise the floor past vLLM's"),
    M("mm-raise-every-pin", MM,
      "if serving_pin(recipe, ctx) in DEFAULT_RAISED_TO_MM_ITEM_PINS and raised > value:",
      "if raised > value:", TESTS, "0.21.0's unset default is taken as raised: its refusal goes unsaid"),
    M("mm-raise-no-pin", MM,
      "if serving_pin(recipe, ctx) in DEFAULT_RAISED_TO_MM_ITEM_PINS and raised > value:",
      "if False:", TESTS, "0.26.0 and later are said to refuse what their raised default starts"),
    M("mm-count-falsy", MM, "        if count == 0 and not (counts_aside or embeds):",
      "        if not count and not (counts_aside or embeds):", TESTS,
      "a limit vLLM does not read as 0 (true, a dict without a count) drops the modality"),
    M("mm-json-text", MM, "            value = json.loads(value)", "            return None", TESTS,
      "a --set written as JSON text is not read"),
    M("mm-text-only", MM,  ' or (recipe.args.get("language-model-only") is True and not embeds)', "", TESTS,
      "language-model-only still gets a multimodal floor"),
    M("mm-way-out-floor", f"{PKG}/recipes/vram.py", "{max(b, floor) for b in (4096, 2048)}",
      "{b for b in (4096, 2048)}", TESTS, "the way out names max-num-batched-tokens 2048, which vLLM refused"),
    M("mm-way-out-start", f"{PKG}/recipes/vram.py", "    start = max(batched, floor)", "    start = batched", TESTS,
      "a recipe already below the floor is told a way out at its own refused max-num-batched-tokens"),
)
