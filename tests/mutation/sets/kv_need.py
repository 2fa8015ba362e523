"""Mutations of vLLM's KV sizing as recipe check does it (kv_need.py) and the VRAM rule that uses it: each term
that makes vLLM's 11.45 GiB (the sliding window's prefill chunk, the window's extra block, unified pages, padded
groups, the DFlash drafter's layers as full attention), the one-type path, the longest context, vLLM serve's
default prefill chunk, the MTP assistant's shared cache, the rule's two verdicts, and the runtime it charges (the line
through vLLM's measured profile, CUDA graphs off for eager, the card too small for it and the way out it names)."""

from run_mutations import PKG, Mutation

KV = f"{PKG}/recipes/kv_need.py"
VRAM = f"{PKG}/recipes/vram.py"
TESTS = ("tests/unit/recipes/test_kv_need.py", "tests/unit/recipes/test_vram_measured.py")

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("kv-chunk", KV, "min(kind.window - 1 + max_num_batched_tokens, max_model_len)",
             "min(kind.window - 1, max_model_len)", TESTS,
             "sliding layers hold their window only, not the prefill chunk beside it (2.7 GiB where vLLM needs 11.45)"),
    Mutation("kv-extra-block", KV, "max_model_len), per_block) + 1", "max_model_len), per_block)", TESTS,
             "a window that starts mid-block is given no extra block"),
    Mutation("kv-page", KV, "page = max(k.token_bytes(dtype_bytes) for k in kinds) * block_size",
             "page = min(k.token_bytes(dtype_bytes) for k in kinds) * block_size", TESTS,
             "pages unified to the smallest layer's, not the largest's"),
    Mutation("kv-groups", KV, "blocks += _cdiv(kind.count, group_size) * _held(",
             "blocks += kind.count // group_size * _held(", TESTS,
             "the last group of a kind is not padded"),
    Mutation("kv-spread", KV, "    if max(k.count for k in kinds) < group_size * GROUP_SPREAD:",
             "    if False:", TESTS,
             "kinds of near-equal counts (12 sliding + 13 full) get the smaller group size"),
    Mutation("kv-uniform", KV, "    if len({k.window for k in kinds}) == 1:", "    if False:", TESTS,
             "one attention type is unified and padded, where vLLM keeps each layer's own page"),
    Mutation("kv-drafter-full", KV, "window = 0 if as_full or not geometry.sliding_window else geometry.sliding_window",
             "window = 0 if not geometry.sliding_window else geometry.sliding_window", TESTS,
             "the DFlash drafter's sliding layers keep their window where the series allocates them as full"),
    Mutation("kv-longest", KV, "        if fits(mid):", "        if fits(mid + 1):", TESTS,
             "the longest context is one short of vLLM's estimate"),
    Mutation("vram-drafter", VRAM, "    kinds = layer_kinds(kv, draft, drafter_sliding_as_full=as_full)",
             "    kinds = layer_kinds(kv, None, drafter_sliding_as_full=as_full)", TESTS,
             "the drafter's layers are left out of what vLLM needs"),
    Mutation("vram-certain", VRAM, "                         if need > budget - weights else",
             "                         if False else", TESTS,
             "a start no runtime memory could allow is only called likely to fail"),
    Mutation("vram-pin", VRAM, "    return recipe.method == \"dflash\" and pin in DFLASH_SLIDING_AS_FULL_PINS",
             "    return recipe.method == \"dflash\"", TESTS,
             "a pin whose series keeps the DFlash drafter's windows is sized as if it allocated them as full"),
    Mutation("vram-default-batched", f"{PKG}/recipes/mm_batched.py",
             "    value = SERVE_BATCHED_LARGE if vram >= LARGE_GPU_GIB else SERVE_BATCHED_SMALL",
             "    value = max_len", TESTS,
             "an unset max-num-batched-tokens is counted as max-model-len, not vLLM serve's default"),
    Mutation("vram-mtp-shares", VRAM, 'and recipe.method != "mtp" else None', "else None", TESTS,
             "an MTP assistant checkpoint's layers are counted, though it reads the target's cache"),
    Mutation("counts-human", f"{PKG}/recipes/counts.py",
             "    if isinstance(value, str):\n        value = human_int(value)\n", "", TESTS,
             "a count written as vLLM reads it ('32k') is taken for unset, sized at vLLM serve's default"),
    Mutation("vram-runtime-flat", VRAM, "g0 + (g1 - g0) / (b1 - b0) * (tokens - b0)", "g0", TESTS,
             "the runtime stays at a measured point's figure whatever the prefill chunk (7.43 GiB at 32768)"),
    Mutation("vram-runtime-one-segment", VRAM, "if tokens < points[n + 1][0]), last)", "if False), last)",
             TESTS, "every chunk on the top segment: 2496 tokens charged below the 2.94 GiB vLLM took there"),
    Mutation("vram-runtime-one-method", VRAM, "key = method if method in RUNTIME_MEASURED else RUNTIME_FALLBACK",
             "key = RUNTIME_FALLBACK", TESTS,
             "MTP charged DFlash's runtime: its 24 GB row (started, 2.02 GiB of KV) reads as refused"),
    Mutation("vram-runtime-eager", VRAM, "(CUDA_GRAPH_GIB[key] if eager else 0.0)", "0.0", TESTS,
             "an eager recipe is charged the CUDA graphs it never captures"),
    Mutation("vram-eager-read", VRAM, 'eager = recipe.args.get("enforce-eager") is True', "eager = False", TESTS,
             "a recipe's enforce-eager is not read"),
    Mutation("vram-no-kv-room", VRAM, "    if fixed >= budget:", "    if weights >= budget:", TESTS,
             "weights and runtime over the budget pass as long as the weights alone fit (24 GB: vLLM refused)"),
    Mutation("vram-suggest-order", VRAM,
             "for new_batched in sorted({start, *(b for b in steps if b < start)}):",
             "for new_batched in sorted({start, *(b for b in steps if b < start)}, reverse=True):", TESTS,
             "the way out keeps the larger prefill chunk and names a shorter context or more of the card"),
    Mutation("vram-chunked-off", VRAM, "    steps = {max(b, floor) for b in (4096, 2048)} if chunked else set()",
             "    steps = {max(b, floor) for b in (4096, 2048)}",
             TESTS, "without chunked prefill the way out names a chunk under max-model-len, which vLLM refuses"),
)
