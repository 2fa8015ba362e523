"""Run vLLM's DFlash input-expansion Triton kernel from a (patched) source file and check it against a plain-Python
reference: a padded verification batch (17 real requests in a 24-row CUDA-graph block table) with rejected drafts.

Checks: every context row gets its block-table slot, query positions continue from the last *accepted* token,
input ids / sample indices / query slots match, and nothing outside the real requests' rows is touched. Then the
cache writes are replayed in the order vLLM's V1 DFlash proposer makes them (every context row's K/V first, by
precompute_and_store_context_kv; then each draft layer writes its query rows' K/V before it attends) and what the
draft attention reads (each request's positions up to its last query) is compared with the same replay in which
rejected context rows write nothing: identical, because the query rows overwrite exactly the rejected rows'
positions. The replay in the opposite order (queries first) must differ, or the comparison could not see a
rejected write at all.

    python run_dflash_kernel.py --kernel-source vllm/v1/spec_decode/utils.py [--device cuda|cpu] [--json]

With ``--device cpu`` set TRITON_INTERPRET=1 (Triton's interpreter, numpy) before running. Exit status 0 when
every check passes, 1 when one fails, 2 when the kernel cannot be loaded. Needs torch and triton only.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

KERNEL_NAME = "copy_and_expand_dflash_inputs_kernel"
SENTINEL = -7  # written into every output before the launch: untouched rows keep it


def load_kernel(source: Path, workdir: Path) -> Any:
    """The kernel function, exactly as written in ``source``, compiled by triton.jit from a file of its own
    (triton needs real source lines; the rest of the vLLM module is not imported)."""
    text = source.read_text()
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == KERNEL_NAME:
            start = min(d.lineno for d in node.decorator_list) if node.decorator_list else node.lineno
            body = "\n".join(text.splitlines()[start - 1 : node.end_lineno])
            break
    else:
        raise LookupError(f"{source}: no function {KERNEL_NAME}")
    module_file = workdir / "dflash_kernel_under_test.py"
    module_file.write_text(f"import triton\nimport triton.language as tl\n\n\n{body}\n")
    spec = importlib.util.spec_from_file_location("dflash_kernel_under_test", module_file)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, KERNEL_NAME)


@dataclass(frozen=True, kw_only=True)
class Batch:
    """A padded verification step: request i verifies ctx_lens[i] context tokens, the last rejected[i] of which
    are rejected drafts; block_table has padded_reqs rows (rows past num_reqs are the null block 0)."""

    num_reqs: int
    padded_reqs: int
    num_spec: int
    block_size: int
    max_blocks: int
    ctx_lens: list[int]
    rejected: list[int]
    start_pos: list[int]
    block_table: list[list[int]]
    next_tokens: list[int]
    mask_token: int


def make_batch(seed: int = 0, num_reqs: int = 17, padded_reqs: int = 24, num_spec: int = 3) -> Batch:
    gen = torch.Generator().manual_seed(seed)

    def randint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi, (1,), generator=gen))

    block_size, max_blocks = 16, 40
    ctx_lens, rejected, start_pos = [], [], []
    for i in range(num_reqs):
        if i == 5:  # a chunk of prefill: long enough for several kernel blocks, nothing rejected
            ctx_lens.append(300)
            rejected.append(0)
        else:
            ctx_lens.append(1 + num_spec)
            rejected.append(randint(0, num_spec + 1))
        start_pos.append(randint(0, 250))
    rejected[0], rejected[1] = num_spec, 0  # all drafts rejected / all accepted
    used = iter(torch.randperm(4000, generator=gen).add(1).tolist())  # distinct real block ids, never 0
    table = [[next(used) for _ in range(max_blocks)] for _ in range(num_reqs)]
    table += [[0] * max_blocks for _ in range(padded_reqs - num_reqs)]
    return Batch(
        num_reqs=num_reqs,
        padded_reqs=padded_reqs,
        num_spec=num_spec,
        block_size=block_size,
        max_blocks=max_blocks,
        ctx_lens=ctx_lens,
        rejected=rejected,
        start_pos=start_pos,
        block_table=table,
        next_tokens=[1000 + i for i in range(num_reqs)],
        mask_token=99,
    )


def reference(b: Batch) -> dict[str, list[int]]:
    """What the kernel must produce, in plain Python (padded query rows stay SENTINEL)."""
    q = 1 + b.num_spec
    total_ctx = sum(b.ctx_lens)
    out = {
        "context_positions": [SENTINEL] * total_ctx,
        "context_slots": [SENTINEL] * total_ctx,
        "query_positions": [SENTINEL] * (b.padded_reqs * q),
        "query_slots": [SENTINEL] * (b.padded_reqs * q),
        "input_ids": [SENTINEL] * (b.padded_reqs * q),
        "token_indices": [SENTINEL] * (b.padded_reqs * b.num_spec),
    }

    def slot(req: int, pos: int) -> int:
        block = min(pos // b.block_size, b.max_blocks - 1)
        return b.block_table[req][block] * b.block_size + pos % b.block_size

    row = 0
    for r in range(b.num_reqs):
        n, rej = b.ctx_lens[r], b.rejected[r]
        for j in range(n):
            pos = b.start_pos[r] + j
            out["context_positions"][row + j] = pos
            out["context_slots"][row + j] = slot(r, pos)
        last_accepted = b.start_pos[r] + n - rej - 1
        for k in range(q):
            pos = last_accepted + 1 + k
            out["query_positions"][r * q + k] = pos
            out["query_slots"][r * q + k] = slot(r, pos)
            out["input_ids"][r * q + k] = b.next_tokens[r] if k == 0 else b.mask_token
            if k > 0:
                out["token_indices"][r * b.num_spec + k - 1] = r * q + k
        row += n
    return out


def run_kernel(kernel: Any, b: Batch, device: str) -> dict[str, list[int]]:
    """Launch the kernel the way vLLM's V1 DFlash proposer does (grid = real requests x blocks)."""
    q = 1 + b.num_spec
    i32, i64 = torch.int32, torch.int64
    total_ctx = sum(b.ctx_lens)
    qsl = [0]
    for n in b.ctx_lens:
        qsl.append(qsl[-1] + n)
    positions = [b.start_pos[r] + j for r in range(b.num_reqs) for j in range(b.ctx_lens[r])]

    def full(n: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.full((n,), SENTINEL, dtype=dtype, device=device)

    outs = {
        "input_ids": full(b.padded_reqs * q, i32),
        "context_positions": full(total_ctx, i64),
        "query_positions": full(b.padded_reqs * q, i64),
        "context_slots": full(total_ctx, i64),
        "query_slots": full(b.padded_reqs * q, i64),
        "token_indices": full(b.padded_reqs * b.num_spec, i32),
    }
    block_table = torch.tensor(b.block_table, dtype=i32, device=device)
    max_tokens_per_req = max(b.ctx_lens) + q
    block = min(256, 1 << (max_tokens_per_req - 1).bit_length())
    grid = (b.num_reqs, -(-max_tokens_per_req // block))
    kernel[grid](
        next_token_ids_ptr=torch.tensor(b.next_tokens, dtype=i32, device=device),
        target_positions_ptr=torch.tensor(positions, dtype=i64, device=device),
        out_input_ids_ptr=outs["input_ids"],
        out_context_positions_ptr=outs["context_positions"],
        out_query_positions_ptr=outs["query_positions"],
        out_context_slot_mapping_ptr=outs["context_slots"],
        out_query_slot_mapping_ptr=outs["query_slots"],
        out_token_indices_ptr=outs["token_indices"],
        block_table_ptr=block_table,
        block_table_stride=block_table.stride(0),
        query_start_loc_ptr=torch.tensor(qsl, dtype=i32, device=device),
        num_rejected_tokens_ptr=torch.tensor(b.rejected, dtype=i32, device=device),
        parallel_drafting_token_id=b.mask_token,
        block_size=b.block_size,
        num_query_per_req=q,
        num_speculative_tokens=b.num_spec,
        total_input_tokens=total_ctx,
        BLOCK_SIZE=block,
        HAS_NUM_REJECTED=True,
    )
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {k: v.cpu().tolist() for k, v in outs.items()}


def rejected_context_rows(b: Batch) -> list[int]:
    """Context rows that carry rejected draft tokens (the last rejected[r] rows of request r)."""
    rows, start = [], 0
    for n, rej in zip(b.ctx_lens, b.rejected, strict=True):
        rows += range(start + n - rej, start + n)
        start += n
    return rows


def draft_reads(b: Batch, got: dict[str, list[int]], skip_rows: set[int], queries_first: bool = False) -> list[str]:
    """Replay the kernel's slot mappings as cache writes (a slot holds the tag of its last writer; negative slots
    write nothing), context rows then query rows unless queries_first, and return, per real request, the tags at
    every position from its first context position to its last query position: what the draft attention reads
    of this step's writes."""
    cache: dict[int, str] = {}

    def context() -> None:
        for row, s in enumerate(got["context_slots"]):
            if s >= 0 and row not in skip_rows:
                cache[s] = f"context row {row}"

    def queries() -> None:
        for i, s in enumerate(got["query_slots"][: b.num_reqs * (1 + b.num_spec)]):
            if s >= 0:
                cache[s] = f"query row {i}"

    for step in (queries, context) if queries_first else (context, queries):
        step()
    reads = []
    for r in range(b.num_reqs):
        last_accepted = b.start_pos[r] + b.ctx_lens[r] - b.rejected[r] - 1
        for pos in range(b.start_pos[r], last_accepted + b.num_spec + 1):
            block = b.block_table[r][min(pos // b.block_size, b.max_blocks - 1)]
            reads.append(f"request {r} position {pos}: {cache.get(block * b.block_size + pos % b.block_size)}")
    return reads


def compare(b: Batch, got: dict[str, list[int]], want: dict[str, list[int]]) -> dict[str, str]:
    """One verdict per check: 'ok' or the first mismatch."""
    verdicts: dict[str, str] = {}
    rejected = rejected_context_rows(b)

    def first_diff(name: str, rows: list[int]) -> str:
        for i in rows:
            if got[name][i] != want[name][i]:
                return f"{name}[{i}]: expected {want[name][i]}, found {got[name][i]}"
        return "ok"

    for name in ("context_slots", "context_positions", "query_positions", "query_slots", "input_ids", "token_indices"):
        verdicts[name] = first_diff(name, list(range(len(want[name]))))
    verdicts["rejected_rows_present"] = "ok" if rejected else "the batch has no rejected rows"

    as_run = draft_reads(b, got, skip_rows=set())
    without_rejected = draft_reads(b, got, skip_rows=set(rejected))
    pairs = zip(as_run, without_rejected, strict=True)
    diff = next((f"{x} (rejected rows writing nothing: {y})" for x, y in pairs if x != y), None)
    verdicts["draft_reads_same_without_rejected_writes"] = diff or "ok"
    reversed_order = draft_reads(b, got, skip_rows=set(), queries_first=True)
    verdicts["replay_sees_rejected_writes_in_other_order"] = (
        "ok" if reversed_order != without_rejected else "queries-first replay reads the same: the check is blind"
    )
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel-source", type=Path, required=True, help="vllm/v1/spec_decode/utils.py to test")
    parser.add_argument("--device", default="cuda", help="cuda (real Triton) or cpu (TRITON_INTERPRET=1)")
    parser.add_argument("--seeds", type=int, default=3, help="how many random batches")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import triton

    with tempfile.TemporaryDirectory() as tmp:
        try:
            kernel = load_kernel(args.kernel_source, Path(tmp))
        except (OSError, LookupError, SyntaxError) as exc:
            print(f"cannot load the kernel: {exc}", file=sys.stderr)
            return 2
        runs = []
        for seed in range(args.seeds):
            batch = make_batch(seed)
            got = run_kernel(kernel, batch, args.device)
            runs.append({"seed": seed, "checks": compare(batch, got, reference(batch))})
    ok = all(v == "ok" for run in runs for v in run["checks"].values())
    report = {
        "kernel_source": str(args.kernel_source),
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "batch": "17 real requests, block table padded to 24 rows, 3 speculative tokens, one 300-token prefill",
        "ok": ok,
        "runs": runs,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['kernel_source']} on {report['device']} (torch {report['torch']}, triton {report['triton']})")
        for run in runs:
            for name, verdict in run["checks"].items():
                print(f"  seed {run['seed']} {name}: {verdict}")
        print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
