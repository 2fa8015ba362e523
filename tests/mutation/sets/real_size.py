"""Gemma 4 26B-A4B at real size (issue 52 items 1 and 3, CPU part): the published shapes, the parameter and KV
count, the speed-up model and the step-cost folding."""

from __future__ import annotations

from run_mutations import Mutation

E2E = "tests/gpu/e2e"
SIZE = ("tests/unit/gpu_scripts/test_real_size.py",)
SPEED = ("tests/unit/gpu_scripts/test_speedup.py",)
STEPS = ("tests/unit/gpu_scripts/test_step_costs.py",)

M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    M("rs-global-kv-heads", f"{E2E}/real_size.py", "NUM_GLOBAL_KV_HEADS = 2", "NUM_GLOBAL_KV_HEADS = 4",
      SIZE, "the full layers' 2 KV heads (k_eq_v): a wrong one is caught by the count, KV bytes and the MTP"),
    M("rs-expert-width", f"{E2E}/real_size.py", "MOE_INTERMEDIATE = 704", "MOE_INTERMEDIATE = 768",
      SIZE, "the expert width: 26B total / 3.8B active hold only at the published 704"),
    M("rs-no-shared-mlp", f"{E2E}/size_model.py", 'dense = len(layers) * 3 * hidden * int(tc["intermediate_size"])',
      "dense = 0", SIZE, "every 26B-A4B layer keeps a dense MLP beside its experts"),
    M("rs-kv-uncapped", f"{E2E}/size_model.py",
      "kept = context_tokens if layer.window is None else min(context_tokens, layer.window)",
      "kept = context_tokens", SIZE, "sliding layers hold at most their window of KV"),
    M("rs-kv-only-k", f"{E2E}/size_model.py", "total += 2 * layer.kv_heads", "total += layer.kv_heads",
      SIZE, "vLLM caches K and V, also on k_eq_v layers"),
    M("rs-shared-kv-counted", f"{E2E}/size_model.py", "    for kind in layers[:first_shared]:",
      "    for kind in layers:", SIZE, "an MTP drafter's KV-shared layers hold no cache of their own"),
    M("su-best-k-no-target", f"{E2E}/speedup.py", "k_best, s_best = 0, 1.0", "k_best, s_best = 0, 0.0",
      SPEED, "no drafter when no k beats the target alone"),
    M("su-tie-larger-k", f"{E2E}/speedup.py", "        if s > s_best:", "        if s >= s_best:",
      SPEED, "the smaller k on a tie"),
    M("sc-steps-from-tokens", f"{E2E}/step_costs.py", "steps = drafts / conc", "steps = n_out - 1",
      STEPS, "speculative steps counted from vLLM's drafts, so an accepting drafter's fewer steps are seen"),
    M("sc-ratio-wrong-cell", f"{E2E}/step_costs.py", 'base = target.get((c["concurrency"], c["context"]))',
      'base = target.get((1, c["context"]))', STEPS, "a speculative step is compared to the target's in its cell"),
)
