"""Mutations of the series' split-KV verification dispatch (dflash-batched-verification 0007 on 0.21.0, 0.26.0
and 0.29.0: its guards, its bound and its variable, run by Triton's CPU interpreter), of the build estimate
held to the timed builds, and of the compile-work fold's timeout floor. The vs- mutations' tests read the pins'
sdists (marked network): run them with --network (the sdists cached, nothing fetched)."""

from run_mutations import PKG, Mutation

PATCHES = {pin: f"patches/dflash-batched-verification/vllm-{pin}/0007-triton-verification-split-kv.patch"
           for pin in ("0.21.0", "0.26.0", "0.29.0")}
PATCH, PATCH_26, PATCH_29 = PATCHES["0.21.0"], PATCHES["0.26.0"], PATCHES["0.29.0"]
KERNEL = ("tests/integration/test_verify_attention_interpreter.py",)
EMPTY_SEGMENT = '+    segm_max = tl.where(segm_expsum > 0.0, segm_max, float("-inf"))'


def _guard(mutation_id: str, patch: str, condition: str, breaks: str) -> Mutation:
    """One of the dispatch's conditions (``and ...``) dropped: the interpreter tests must see the kernel change."""
    return Mutation(mutation_id, patch, f"+        and {condition}", "+        and True", KERNEL, breaks)


MUTATIONS: tuple[Mutation, ...] = (
    _guard("vs-sliding", PATCH, "sliding_window_val <= 0",
           "a sliding-window layer keeps the 2D kernel for a verification"),
    _guard("vs-rows", PATCH, "q.shape[0] <= softmax_segm_output.shape[0]",
           "the split kernel only where the segment buffers hold a row for every query token"),
    _guard("vs-mm", PATCH, "not use_mm_prefix", "multimodal prefix ranges keep the 2D kernel"),
    Mutation("vs-bound", PATCH, "+        1 < max_seqlen_q <= verify_split_kv_max_query",
             "+        1 < max_seqlen_q <= verify_split_kv_max_query + 1", KERNEL,
             "17 query tokens a request stay on 2D with the bound 16"),
    Mutation("vs-env", PATCH, '+    raw = os.environ.get("G4B_TRITON_VERIFY_SPLIT_KV", "16")', '+    raw = "16"',
             KERNEL, "G4B_TRITON_VERIFY_SPLIT_KV sets the bound (0 or 1 turns it off)"),
    Mutation("vs-empty-segment", PATCH, EMPTY_SEGMENT, "+    segm_max = segm_max", KERNEL,
             "a segment with no visible key does not set the maximum"),
    Mutation("vs29-empty-segment", PATCH_29, EMPTY_SEGMENT, "+    segm_max = segm_max", KERNEL,
             "a segment with no visible key does not set the maximum on 0.29.0"),
    _guard("vs29-causal", PATCH_29, "use_causal", "a non-causal call keeps the 2D kernel on 0.29.0"),
    _guard("vs29-per-request", PATCH_29, "not use_per_seq_causal",
           "per-request causality keeps the 2D kernel on 0.29.0"),
    _guard("vs29-rswa", PATCH_29, "not use_rswa", "R-SWA layers keep the 2D kernel on 0.29.0"),
    _guard("vs29-sliding", PATCH_29, "sliding_window_val <= 0", "a sliding-window layer keeps the 2D kernel on 0.29.0"),
    _guard("vs29-tuned", PATCH_29, "not tuned_large_head", "the tuned large-head launch keeps the 2D kernel on 0.29.0"),
    Mutation("vs-padded-rows", PATCH, "+    if query_token_idx >= tl.load(query_start_len_ptr + num_seqs):",
             "+    if query_token_idx >= tl.load(query_start_len_ptr + num_seqs) + 1000000:", KERNEL,
             "the reduction leaves the rows of a padded batch alone"),
    _guard("vs26-mm", PATCH_26, "not use_mm_prefix", "0.26.0's file is 0.29.0's"),
    Mutation("vs-estimate-rest", f"{PKG}/builder/prereqs.py", "REST_S = 130", "REST_S = 13",
             ("tests/unit/builder/test_windows_plan_first_hour.py",),
             "the build estimate stays within a tenth of each timed build"),
    Mutation("cw-timeout-floor", "tests/benchmarks/bench_wheel_compile_work.py", '        return floor, "timed_out"',
             '        return fallback, "timed_out"',
             ("tests/unit/gpu_scripts/test_compile_work_result.py", "tests/unit/builder/test_build_units.py"),
             "a compile-work sample past the timeout counts at the timeout"),
)
