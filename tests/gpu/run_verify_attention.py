"""TRITON_ATTN's unified attention on a verification step: k + 1 query tokens a request over a long paged context.

vLLM 0.21.0 launches its split-KV ("3D") kernel only when every request has one query token
(``vllm/v1/attention/ops/triton_unified_attention.py``: ``use_3d`` is off for ``max_seqlen_q > 1``), so a target
verifying a drafter's k tokens runs the 2D kernel, whose grid for Gemma 4 26B-A4B's full layers (head 512, 2 KV
heads, 8 query heads each) is a handful of thread blocks that each walk every key of the context. The real-size step
costs (tests/gpu/results/vllm-0.21.0-real-size.json) grew far more with the context with a drafter than without.

This script loads the kernel file of a source tree twice: as released, and with that one condition widened to
``max_seqlen_q > MAX_3D_QUERY`` (an experiment, not a patch of the series). It runs both on one verification batch
and compares each with attention computed in float32 by torch from the same paged cache; on a GPU it also times
them (CUDA events, the median of --iters launches after a warm-up).

  python run_verify_attention.py --source TREE [--device cpu|cuda] [--shape NAME] [--queries 1,4,9,16]
                                 [--context N] [--seqs N] [--iters N] [--low-scores] [--json]

On a CPU set TRITON_INTERPRET=1 before Python starts (tests/integration/series_dflash does, in a subprocess):
Triton's interpreter runs the kernels on numpy, slowly, so the CPU shapes are small. Exit 0 when every output is
within tolerance of the reference (relative to its largest value), 1 when one is not, 2 on bad arguments or a
source tree this does not recognise.
"""

from __future__ import annotations

import argparse
import ast
import enum
import importlib.util
import json
import logging
import statistics
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import torch

KERNEL_FILE = "vllm/v1/attention/ops/triton_unified_attention.py"
HELPERS_FILE = "vllm/v1/attention/ops/triton_attention_helpers.py"
KV_FILE = "vllm/v1/kv_cache_interface.py"
GATE = "or max_seqlen_q > 1\n"  # the released condition that keeps a multi-token query off the 3D kernel
# the series' own dispatch (dflash-batched-verification 0007)
SERIES_DISPATCH = "verify_split_kv_max_query = _verify_split_kv_max_query()"
MAX_3D_QUERY = 16  # the experiment's bound: a DFlash verification of 15 drafts + 1
SEGMENTS = 16  # vLLM 0.21.0's NUM_PAR_SOFTMAX_SEGMENTS
# (query heads, KV heads, head size, block size, window): Gemma 4 26B-A4B's full layer; a small one for the CPU
SHAPES = {"gemma4-full": (16, 2, 512, 16, -1), "gemma4-sliding": (16, 8, 256, 16, 1024),
          "small": (8, 2, 64, 16, -1), "small-sliding": (8, 2, 64, 16, 48)}
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}  # of the largest output value


def kv_quant_mode(source: Path) -> type[enum.IntEnum]:
    """The tree's own KVQuantMode (its members and values differ between releases: 0.29.0 put INT4 at 4), read
    as data from ``vllm/v1/kv_cache_interface.py``: the integer assignments of that class, nothing executed."""
    path = source / KV_FILE
    if not path.is_file():
        _refuse(f"{path}: not found: the kernels compare against this tree's KVQuantMode (its values differ between "
                "releases); carry it beside the kernel files")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError) as exc:
        _refuse(f"{path}: not readable as Python source: {exc}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "KVQuantMode":
            members = {t.id: v.value for item in node.body if isinstance(item, ast.Assign)
                       for t in item.targets if isinstance(t, ast.Name)
                       if isinstance((v := item.value), ast.Constant) and isinstance(v.value, int)}
            if members:
                return enum.IntEnum("KVQuantMode", members)  # type: ignore[return-value]
    _refuse(f"{path}: no KVQuantMode class of integer members: this tree's kernels cannot be given its values")
    raise AssertionError("unreachable")


def _package(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = []  # a namespace for the modules below it
    return mod


def _stub_vllm(source: Path) -> None:
    """The few vLLM modules the kernel file imports, as plain modules (no vLLM install needed)."""
    import triton
    import triton.language as tl

    mods = {name: _package(name) for name in ("vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.ops")}
    envs = types.ModuleType("vllm.envs")
    envs.VLLM_BATCH_INVARIANT = False  # type: ignore[attr-defined]
    logger = types.ModuleType("vllm.logger")
    logger.init_logger = logging.getLogger  # type: ignore[attr-defined]
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(  # type: ignore[attr-defined]
        fp8_dtype=lambda: torch.float8_e4m3fn,
        # 0.26.0 on ask it of a 256-wide head with several query tokens (their tuned launch is for family 100)
        is_device_capability_family=lambda family: (torch.cuda.is_available()
                                                    and torch.cuda.get_device_capability()[0] == family // 10))
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.tl, triton_utils.triton = tl, triton  # type: ignore[attr-defined]
    kv = types.ModuleType("vllm.v1.kv_cache_interface")
    kv.KVQuantMode = kv_quant_mode(source)  # type: ignore[attr-defined]
    for mod in (envs, logger, platforms, triton_utils, kv):
        mods[mod.__name__] = mod
    sys.modules.update(mods)


def _refuse(message: str) -> None:
    print(message, file=sys.stderr)
    raise SystemExit(2)


def _load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        _refuse(f"cannot load {path}: expected a vLLM source tree (sdist, patched tree or installed package)")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def widened(text: str, max_query: int) -> str:
    """The kernel file's source with the 3D kernel allowed for up to ``max_query`` query tokens a request, where
    its segment buffers hold a row for every query token (else the 2D kernel, as released); ValueError where the
    released condition is not there once (another release's dispatch)."""
    if text.count(GATE) != 1:
        raise ValueError(f"expected the condition {GATE.strip()!r} once, found it {text.count(GATE)} times: this "
                         "tree's kernel dispatch is not 0.21.0's")
    indent = text[: text.index(GATE)].rsplit("\n", 1)[1]
    return text.replace(GATE, f"or max_seqlen_q > {max_query}\n{indent}or q.shape[0] > softmax_segm_output.shape[0]\n")


def load_kernels(source: Path, work: Path) -> dict[str, types.ModuleType]:
    """The kernel file as released and with the 3D kernel allowed up to MAX_3D_QUERY query tokens a request. A tree
    that carries the series' dispatch (dflash-batched-verification 0007) is run as it is, against itself with the
    dispatch set back to one query token (as released): the module's own bound, which G4B_TRITON_VERIFY_SPLIT_KV
    sets when it is imported."""
    if not (source / KERNEL_FILE).is_file():
        _refuse(f"{source / KERNEL_FILE}: not found: expected a vLLM source tree")
    _stub_vllm(source)
    _load(source / HELPERS_FILE, "vllm.v1.attention.ops.triton_attention_helpers")
    text = (source / KERNEL_FILE).read_text(encoding="utf-8")
    if SERIES_DISPATCH in text:
        copy = work / "unified_series.py"
        copy.write_text(text, encoding="utf-8")
        released = _load(copy, "g4_unified_series_off")
        released.verify_split_kv_max_query = 1  # type: ignore[attr-defined]
        return {"released": released, "3d": _load(copy, "g4_unified_series")}
    try:
        wide = widened(text, MAX_3D_QUERY)
    except ValueError as exc:
        _refuse(f"{source / KERNEL_FILE}: {exc}")
    released = work / "unified_released.py"
    wider = work / "unified_3d_verify.py"
    released.write_text(text, encoding="utf-8")
    wider.write_text(wide, encoding="utf-8")
    return {"released": _load(released, "g4_unified_released"), "3d": _load(wider, "g4_unified_3d_verify")}


def query_lengths(seqs: int, query: int, mixed: bool) -> list[int]:
    """Each request's query tokens: ``query`` for all, or (mixed) a verification, a decode and a short chunk in
    turn (query, 1, query // 2 + 1, ...), as a step that mixes them launches them together."""
    if not mixed:
        return [query] * seqs
    return [(query, 1, query // 2 + 1)[i % 3] for i in range(seqs)]


def make_batch(shape: str, seqs: int, query: int, context: int, dtype: torch.dtype, device: str,
               seed: int = 0, mixed: bool = False, pad: int = 0, low_scores: bool = False) -> dict[str, Any]:
    """``seqs`` requests of ``context`` tokens each (the last query tokens of each the step's queries, see
    :func:`query_lengths`; the requests' lengths differ a little so that segment boundaries fall differently),
    their K/V in a paged cache under a shuffled block table; ``pad`` query rows past the last request, as a CUDA
    graph's padded batch launches them (no request owns them; their outputs are not compared). ``low_scores``: every
    key leans one way and every query the other, so that every attention score lies far below 0 (about -110 in
    units of the softmax): softmax does not care where the scores lie, a kernel that rescales by a maximum of 0
    loses them all to underflow."""
    heads, kv_heads, head, block, window = SHAPES[shape]
    gen = torch.Generator().manual_seed(seed)
    lens = [context - 7 * i for i in range(seqs)]
    blocks_per = -(-max(lens) // block)
    num_blocks = seqs * blocks_per + 1
    order = torch.randperm(num_blocks - 1, generator=gen) + 1  # block 0 unused, as vLLM's null block
    table = order[: seqs * blocks_per].view(seqs, blocks_per).to(torch.int32)
    k = torch.randn(num_blocks, block, kv_heads, head, generator=gen).to(dtype)
    v = torch.randn(num_blocks, block, kv_heads, head, generator=gen).to(dtype)
    qlens = query_lengths(seqs, query, mixed)
    q = torch.randn(sum(qlens) + pad, heads, head, generator=gen).to(dtype)
    if low_scores:
        lean = torch.randn(head, generator=gen)
        lean = lean / lean.norm() * (110 * head ** 0.5) ** 0.5
        k, q = (k.float() + lean).to(dtype), (q.float() - lean).to(dtype)
    cu = torch.tensor([sum(qlens[:i]) for i in range(seqs + 1)], dtype=torch.int32)
    return {"shape": shape, "heads": heads, "kv_heads": kv_heads, "head": head, "block": block, "window": window,
            "lens": lens, "query": max(qlens), "qlens": qlens, "real_rows": sum(qlens),
            "q": q.to(device), "k": k.to(device), "v": v.to(device),
            "table": table.to(device), "cu": cu.to(device),
            "seqused": torch.tensor(lens, dtype=torch.int32, device=device)}


def reference(b: dict[str, Any]) -> torch.Tensor:
    """Causal attention of each query token over its request's keys (and the window), in float32."""
    group = b["heads"] // b["kv_heads"]
    scale = b["head"] ** -0.5
    out = torch.empty(b["q"].shape, dtype=torch.float32)
    q_all = b["q"].float().cpu()
    k_cache, v_cache, table = b["k"].float().cpu(), b["v"].float().cpu(), b["table"].cpu()
    first = 0
    for r, length in enumerate(b["lens"]):
        blocks = table[r, : -(-length // b["block"])].long()
        keys = k_cache[blocks].reshape(-1, b["kv_heads"], b["head"])[:length]
        vals = v_cache[blocks].reshape(-1, b["kv_heads"], b["head"])[:length]
        qlen = b["qlens"][r]
        for i in range(qlen):
            pos = length - qlen + i
            lo = 0 if b["window"] < 0 else max(0, pos - b["window"] + 1)
            qi = q_all[first + i].view(b["kv_heads"], group, b["head"])
            kk, vv = keys[lo: pos + 1].transpose(0, 1), vals[lo: pos + 1].transpose(0, 1)
            p = torch.softmax(torch.einsum("hgd,hnd->hgn", qi, kk) * scale, dim=-1)
            out[first + i] = torch.einsum("hgn,hnd->hgd", p, vv).reshape(b["heads"], b["head"])
        first += qlen
    return out[: b["real_rows"]]


def buffers(b: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 3D kernel's segment buffers, a row per query token unless the batch says fewer (``buffer_rows``: vLLM
    0.21.0 sizes them for one token a request), NaN until the 3D kernel writes them."""
    rows, device = b.get("buffer_rows") or b["q"].shape[0], b["q"].device
    padded = 1 << (b["head"] - 1).bit_length()
    nan = float("nan")
    return (torch.full((rows, b["heads"], SEGMENTS, padded), nan, dtype=torch.float32, device=device),
            torch.full((rows, b["heads"], SEGMENTS), nan, dtype=torch.float32, device=device),
            torch.full((rows, b["heads"], SEGMENTS), nan, dtype=torch.float32, device=device))


def launch(module: types.ModuleType, b: dict[str, Any], out: torch.Tensor,
           segm: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    """One call as vLLM 0.21.0's TritonAttentionImpl makes it."""
    one = torch.tensor(1.0, dtype=torch.float32, device=b["q"].device)
    window = (-1, -1) if b["window"] < 0 else (b["window"] - 1, 0)
    module.unified_attention(
        q=b["q"], k=b["k"], v=b["v"], out=out, cu_seqlens_q=b["cu"], max_seqlen_q=b["query"],
        seqused_k=b["seqused"], max_seqlen_k=max(b["lens"]), softmax_scale=b["head"] ** -0.5, causal=True,
        window_size=window, block_table=b["table"], softcap=0, q_descale=None, k_descale=one, v_descale=one,
        seq_threshold_3D=len(b["lens"]), num_par_softmax_segments=SEGMENTS, softmax_segm_output=segm[0],
        softmax_segm_max=segm[1], softmax_segm_expsum=segm[2])


def kernel_seen(segm: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> str:
    """Which kernel ran, as seen: only the 3D kernel writes the segment buffers, which start as NaN."""
    return "2d" if bool(torch.isnan(segm[2]).all()) else "3d"


def time_ms(module: types.ModuleType, b: dict[str, Any], iters: int) -> float:
    """Milliseconds a launch, ``iters`` launches back to back between two CUDA events (buffers made beforehand,
    so that neither their allocation nor one launch's host latency is timed), the median of five such runs."""
    out, segm = torch.empty_like(b["q"]), buffers(b)
    for _ in range(3):
        launch(module, b, out, segm)
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            launch(module, b, out, segm)
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) / iters)
    return statistics.median(runs)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        kernels = load_kernels(args.source, Path(tmp))
        dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
        rows = []
        for query in args.queries:
            b = make_batch(args.shape, args.seqs, query, args.context, dtype, args.device, mixed=args.mixed,
                           pad=args.pad, low_scores=args.low_scores)
            b["buffer_rows"] = args.buffer_rows
            ref = reference(b)
            row: dict[str, Any] = {"shape": args.shape, "seqs": args.seqs, "query": query, "context": args.context}
            if args.mixed or args.pad:
                row |= {"query_lengths": b["qlens"], "pad_rows": args.pad}
            if args.low_scores:
                row["low_scores"] = True
            outs = {}
            scale = ref.abs().max().item()
            for name, module in kernels.items():
                out, segm = torch.zeros_like(b["q"]), buffers(b)
                outs[name] = out
                launch(module, b, out, segm)
                if args.device == "cuda":
                    torch.cuda.synchronize()
                row[f"{name}_kernel"] = kernel_seen(segm)
                real = out[: b["real_rows"]]
                err = (real.float().cpu() - ref).abs().max().item()
                # relative to the largest output: at 16K keys an output is small, and an absolute bound would
                # pass a kernel that dropped a segment
                row[f"{name}_max_error"] = err
                row[f"{name}_relative_error"] = err / scale
                row[f"{name}_ok"] = bool(err <= TOLERANCE[dtype] * scale) and not bool(torch.isnan(real).any())
                if args.device == "cuda" and args.iters:
                    row[f"{name}_ms"] = time_ms(module, b, args.iters)
            # two computations, not one: split-softmax segments round differently from one pass over the keys
            row["released_vs_3d"] = (outs["released"][: b["real_rows"]].float()
                                     - outs["3d"][: b["real_rows"]].float()).abs().max().item()
            if "released_ms" in row and "3d_ms" in row:
                row["speedup"] = row["released_ms"] / row["3d_ms"]
            rows.append(row)
    ok = all(r["released_ok"] and r["3d_ok"] for r in rows)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (Triton interpreter)"
    series = getattr(kernels["3d"], "verify_split_kv_max_query", None)
    return {"ok": ok, "device": device, "dtype": str(dtype).removeprefix("torch."), "tolerance": TOLERANCE[dtype],
            "dispatch": "series" if series is not None else "experiment",
            # which kernel ran is not part of ok: a timing whose split kernel was never taken shows here
            "split_taken": sum(r["3d_kernel"] == "3d" and r["query"] > 1 for r in rows),
            "max_3d_query": series if series is not None else MAX_3D_QUERY, "rows": rows}


def _queries(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1 or max(values) > 2 * MAX_3D_QUERY:
        raise argparse.ArgumentTypeError(f"queries {text!r}: expected integers 1..{2 * MAX_3D_QUERY}, e.g. 1,4,9,16")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, required=True, help="a vLLM source tree (sdist or patched)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--queries", type=_queries, default=_queries("1,4,9,16"))
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--seqs", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--buffer-rows", type=int, default=0,
                    help="segment buffer rows (default: one per query token); fewer keep the widened dispatch on 2D")
    ap.add_argument("--mixed", action="store_true",
                    help="the requests' query lengths differ: a verification, a decode and a short chunk in turn")
    ap.add_argument("--pad", type=int, default=0, help="query rows past the last request (a padded CUDA graph batch)")
    ap.add_argument("--low-scores", action="store_true",
                    help="every attention score far below 0 (a softmax that rescales by 0 underflows)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.pad < 0:
        ap.error(f"--pad {args.pad}: expected 0 or more")
    if args.buffer_rows < 0:
        ap.error(f"--buffer-rows {args.buffer_rows}: expected 0 (a row per query token) or more")
    if args.context < max(args.queries) + 7 * args.seqs:
        ap.error(f"--context {args.context}: too short for {args.seqs} requests of {max(args.queries)} queries")
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for r in result["rows"]:
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        print("ok" if result["ok"] else "MISMATCH")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
