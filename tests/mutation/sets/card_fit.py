"""A recipe's launch script in a card's share of a bigger GPU (issue 52 item 2, CPU part): the memory share, the
step-down order, vLLM's log lines and the fold."""

from __future__ import annotations

from run_mutations import Mutation

E2E = "tests/gpu/e2e"
FIT = ("tests/unit/gpu_scripts/test_card_fit.py",)

M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    M("cf-util-rounds-up", f"{E2E}/card_fit.py", "util = int(want / total_bytes * 10_000) / 10_000",
      "util = round(want / total_bytes, 4)", FIT, "the share is rounded down: never a budget above the card's"),
    M("cf-no-estimate-skip", f"{E2E}/card_fit.py", "while estimate and new > estimate", "while False and new",
      FIT, "vLLM's estimated maximum model length skips the halvings it already rules out"),
    M("cf-seqs-first", f"{E2E}/card_fit.py",
      'if parsed.get("error_kind") != "no_kv_memory" and context // 2 >= min_context:',
      'if seqs <= 1 and context // 2 >= min_context:', FIT, "context halves before max-num-seqs does"),
    M("cf-weights-no-stop", f"{E2E}/card_fit.py", 'row["weights_exceed_budget"] = row["stop_search"] = weights',
      'row["stop_search"] = False\n    row["weights_exceed_budget"] = weights',
      FIT, "weights alone over the budget end the search: nothing smaller can start"),
    M("cf-stand-in-sign", f"{E2E}/card_fit.py", "args.extra_gib += here_w - card_w", "args.extra_gib += card_w",
      FIT, "the stand-in grows the budget by what bf16 weights exceed the recipe's"),
    M("vl-estimate-lost", f"{E2E}/vllm_log.py", 'int(m.group(4)) if m.group(4) else None', "None",
      FIT, "the estimated maximum model length is read from vLLM's error"),
    M("vl-kv-unsigned", f"{E2E}/vllm_log.py", 'Available KV cache memory: {_SIGNED} GiB',
      'Available KV cache memory: {_NUM} GiB', FIT, "vLLM logs the available KV memory below zero too"),
    M("vl-tokens-comma", f"{E2E}/vllm_log.py", 'r"GPU KV cache size: ([0-9][0-9,]*) tokens"',
      'r"GPU KV cache size: ([0-9]+) tokens"', FIT, "vLLM separates the thousands of the KV token count"),
)
