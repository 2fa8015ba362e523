"""Run the Gemma 4 DFlash shapes through a proxy-built FA2 ``varlen_fwd`` on a CUDA GPU, as vLLM calls it.

For every shape of ``selection.SHAPES`` and every profile (the GPU unmodified, then with SM120's / SM121's selection
forced through the proxy patch's environment variables), it calls ``torch.ops._vllm_fa2_C.varlen_fwd`` with paged KV
the way ``vllm_flash_attn.flash_attn_varlen_func`` does (uninitialised ``cu_seqlens_k`` + ``seqused_k``, block
table), compares with a float32 dense reference, and checks what the library logged it launched against
``selection.select``. ``--sanitize`` reruns the same calls under ``compute-sanitizer`` (memcheck; initcheck too
with ``--initcheck``), with PyTorch's caching allocator off so that every tensor is its own allocation.

    python proxy_run.py --lib BUILD/_vllm_fa2_C.abi3.so --out RESULT.json [--sanitize]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import selection

PROFILES = ("unmodified", *selection.FORCED)
TOLERANCE = {"bfloat16": 2e-2, "float16": 4e-3}  # max |FA2 - fp32 reference| for unit-normal inputs
ENV_KEYS = ("G4_FA2_PROXY_CC", "G4_FA2_PROXY_NUM_SM", "G4_FA2_PROXY_SMEM_PER_BLOCK", "G4_FA2_PROXY_SMEM_PER_SM")


def profile_env(profile: str) -> dict[str, str]:
    if profile == "unmodified":
        return {}
    gpu = selection.GPUS[profile]
    return {
        "G4_FA2_PROXY_CC": f"{gpu.cc[0]}.{gpu.cc[1]}",
        "G4_FA2_PROXY_NUM_SM": str(gpu.num_sm),
        "G4_FA2_PROXY_SMEM_PER_BLOCK": str(gpu.smem_per_block_optin),
        "G4_FA2_PROXY_SMEM_PER_SM": str(gpu.smem_per_sm),
    }


def this_gpu(torch: Any) -> selection.Gpu:
    props = torch.cuda.get_device_properties(0)
    optin = getattr(props, "shared_memory_per_block_optin", 0)
    per_sm = getattr(props, "shared_memory_per_multiprocessor", 0)
    return selection.Gpu(props.name, (props.major, props.minor), props.multi_processor_count, optin, per_sm)


def make_inputs(torch: Any, shape: selection.Shape, seed: int) -> dict[str, Any]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, shape.dtype)
    bs = shape.block_size
    blocks_per_req = [-(-k // bs) for k in shape.k_lens]
    max_blocks = max(blocks_per_req)
    num_blocks = sum(blocks_per_req) + 3
    perm = torch.randperm(num_blocks, generator=gen, device="cuda").to(torch.int32)
    table = torch.zeros((shape.batch, max_blocks), dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(blocks_per_req):
        table[b, :n] = perm[used : used + n]
        used += n
    # padded rows keep a stale copy of a real row, as a graph replay may
    for b in range(len(shape.q_lens), shape.batch):
        table[b] = table[b % len(shape.q_lens)]
    q_lens = list(shape.q_lens) + [0] * shape.padded_rows
    k_lens = list(shape.k_lens) + [0] * shape.padded_rows
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    total_q = int(cu_q[-1])
    q = torch.randn((total_q, shape.heads, shape.hdim), generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    kv_shape = (num_blocks, bs, shape.kv_heads, shape.hdim)
    k = torch.randn(kv_shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    v = torch.randn(kv_shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    return {
        "q": q,
        "k": k,
        "v": v,
        "table": table,
        "cu_q": cu_q,
        "seqused_k": torch.tensor(k_lens, dtype=torch.int32, device="cuda"),
        "q_lens": q_lens,
        "k_lens": k_lens,
    }


def call_fa2(torch: Any, shape: selection.Shape, x: dict[str, Any]) -> Any:
    cu_k = torch.empty_like(x["cu_q"])  # what vllm_flash_attn passes with seqused_k: never initialised
    if shape.garbage_cu_seqlens_k:
        cu_k.fill_(2**30)
    out = torch.empty_like(x["q"])
    result = torch.ops._vllm_fa2_C.varlen_fwd(
        x["q"],
        x["k"],
        x["v"],
        out,
        x["cu_q"],
        cu_k,
        x["seqused_k"],
        None,
        x["table"],
        None,
        max(shape.q_lens),
        max(shape.k_lens),
        0.0,
        shape.hdim**-0.5,
        False,
        shape.causal,
        shape.window[0],
        shape.window[1],
        shape.softcap,
        False,
        0,
        None,
    )
    return result[0]


def reference(torch: Any, shape: selection.Shape, x: dict[str, Any]) -> Any:
    """float32 attention with FA2's mask semantics (bottom-right aligned causal/window), per request."""
    outs = []
    bs = shape.block_size
    group = shape.heads // shape.kv_heads
    for b, (lq, lk) in enumerate(zip(x["q_lens"], x["k_lens"], strict=True)):
        if lq == 0:
            continue
        start = int(x["cu_q"][b])
        q = x["q"][start : start + lq].float()  # (lq, H, d)
        n = -(-lk // bs)
        rows = x["table"][b, :n].long()
        k = x["k"][rows].reshape(n * bs, shape.kv_heads, shape.hdim)[:lk].float()
        v = x["v"][rows].reshape(n * bs, shape.kv_heads, shape.hdim)[:lk].float()
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * shape.hdim**-0.5
        if shape.softcap > 0:
            scores = shape.softcap * torch.tanh(scores / shape.softcap)
        pos = torch.arange(lq, device="cuda")[:, None] + (lk - lq)
        j = torch.arange(lk, device="cuda")[None, :]
        left, right = shape.window
        causal = shape.causal and max(shape.q_lens) > 1
        if causal:
            right = 0
        allowed = torch.ones((lq, lk), dtype=torch.bool, device="cuda")
        if left >= 0 and left < max(shape.k_lens):
            allowed &= j >= pos - left
        if right >= 0 and right < max(shape.k_lens):
            allowed &= j <= pos + right
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(outs, dim=0)


def run_shape(torch: Any, shape: selection.Shape, profile: str, log: Path, seed: int) -> dict[str, Any]:
    for key in ENV_KEYS:
        os.environ.pop(key, None)
    os.environ.update(profile_env(profile))
    os.environ["G4_FA2_PROXY_LOG"] = str(log)
    log.unlink(missing_ok=True)
    x = make_inputs(torch, shape, seed)
    entry: dict[str, Any] = {}
    try:
        out = call_fa2(torch, shape, x)
        torch.cuda.synchronize()
    except RuntimeError as exc:  # the proxy's shared-memory refusal, or a CUDA error
        entry["error"] = str(exc).splitlines()[0][:400]
        out = None
    finally:
        os.environ.pop("G4_FA2_PROXY_LOG", None)
    launches = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    entry["launches"] = launches
    if out is not None:
        real = sum(shape.q_lens)
        ref = reference(torch, shape, x)
        err = (out[:real].float() - ref).abs().max().item()
        entry["max_abs_error"] = round(err, 6)
        entry["tolerance"] = TOLERANCE[shape.dtype]
        entry["output_sha256"] = _digest(torch, out[:real])
    return entry


def _digest(torch: Any, t: Any) -> str:
    import hashlib

    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


def judge(shape: selection.Shape, profile: str, entry: dict[str, Any], gpu: selection.Gpu) -> dict[str, Any]:
    predicted = selection.select(shape, gpu)
    main = [launch for launch in entry.get("launches", []) if launch["family"] != "combine"]
    combine = [launch for launch in entry.get("launches", []) if launch["family"] == "combine"]
    checks: dict[str, Any] = {}
    if main:
        got = main[0]
        checks["selection_matches_model"] = (
            all(got[key] == predicted[key] for key in ("hdim", "block_m", "block_n", "warps"))
            # FA2 leaves params.num_splits at 0 ("not set") when it does not split: the same as 1
            and max(got["num_splits"], 1) == predicted["num_splits"]
            and bool(got["local"]) == predicted["local"]
            and bool(got["causal"]) == predicted["causal"]
            and (bool(combine) == predicted["split"])
        )
        checks["smem_total"] = got["smem_total"]
        checks["smem_static"] = got["smem_static"]
        checks["regs"] = got["regs"]
        checks["spill_bytes"] = got["local_bytes"]
    else:
        checks["selection_matches_model"] = False
    limit = gpu.smem_per_block_optin
    checks["fits_imitated_gpu"] = bool(main) and max(m["smem_total"] for m in main) <= limit
    ok = (
        "error" not in entry
        and entry.get("max_abs_error", 1e9) <= entry.get("tolerance", 0)
        and checks["selection_matches_model"]
        and checks["fits_imitated_gpu"]
    )
    return {"profile": profile, "pass": ok, "predicted": predicted, **checks, **entry}


def run_all(lib: Path, only: list[str] | None) -> dict[str, Any]:
    import torch

    torch.ops.load_library(str(lib))
    here = this_gpu(torch)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, shape in enumerate(selection.SHAPES):
            if only and shape.name not in only:
                continue
            per_profile = {}
            for profile in PROFILES:
                gpu = here if profile == "unmodified" else selection.GPUS[profile]
                entry = run_shape(torch, shape, profile, Path(tmp) / "launch.jsonl", seed=1000 + i)
                per_profile[profile] = judge(shape, profile, entry, gpu)
            base = per_profile["unmodified"].get("output_sha256")
            for profile in selection.FORCED:
                got = per_profile[profile]
                same_kernel = got["predicted"]["num_splits"] == per_profile["unmodified"]["predicted"]["num_splits"]
                got["bitwise_equal_to_unmodified"] = got.get("output_sha256") == base
                got["same_kernel_as_unmodified"] = same_kernel
            results.append({"shape": dataclasses.asdict(shape), "profiles": per_profile})
            print(
                f"{shape.name}: "
                + ", ".join(
                    f"{p}={'pass' if r['pass'] else 'FAIL'} err={r.get('max_abs_error')} smem={r.get('smem_total')}"
                    for p, r in per_profile.items()
                ),
                flush=True,
            )
    return {"gpu": dataclasses.asdict(here), "torch": torch.__version__, "cuda": torch.version.cuda, "results": results}


def rejudge(path: Path, sanitizer_files: list[Path]) -> dict[str, Any]:
    """The verdicts again, from what a run recorded (launch logs, errors, digests), with this file's judge."""
    report = json.loads(path.read_text())
    here = selection.Gpu(**{**report["gpu"], "cc": tuple(report["gpu"]["cc"])})
    by_name = {shape.name: shape for shape in selection.SHAPES}
    for row in report["results"]:
        shape = by_name[row["shape"]["name"]]
        for profile, old in row["profiles"].items():
            entry = {
                k: old[k] for k in ("launches", "error", "max_abs_error", "tolerance", "output_sha256") if k in old
            }
            gpu = here if profile == "unmodified" else selection.GPUS[profile]
            new = judge(shape, profile, entry, gpu)
            for key in ("bitwise_equal_to_unmodified", "same_kernel_as_unmodified"):
                if key in old:
                    new[key] = old[key]
            row["profiles"][profile] = new
    runs = [run for f in sanitizer_files for run in json.loads(f.read_text())["sanitizer"]]
    for run in runs:
        # runs recorded before calls_made counted the whole output counted only its last 1500 characters; a loop
        # that ended with return code 0 made every call
        if run.get("ran") and run.get("returncode") == 0 and run.get("shapes") == "all":
            run["calls_made"] = "all (the loop ended, return code 0)"
    if runs:
        report["sanitizer"] = runs
    report["rejudged_from"] = path.name
    return report


SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")


def sanitize(lib: Path, tool: str, timeout: int, only: list[str] | None = None) -> dict[str, Any]:
    exe = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(exe).exists():
        return {"tool": tool, "ran": False, "why": "compute-sanitizer not found"}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "sanitizer.log"
        env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
        cmd = [
            exe,
            "--tool",
            tool,
            "--log-file",
            str(log),
            "--print-limit",
            "30",
            sys.executable,
            str(Path(__file__).resolve()),
            "--lib",
            str(lib),
            "--calls-only",
            *(["--only", *only] if only else []),
        ]
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
            rc: int | str = proc.returncode
            tail = (proc.stdout + proc.stderr)[-1500:]
            calls = len([line for line in proc.stdout.splitlines() if line.startswith(("called", "refused"))])
        except subprocess.TimeoutExpired:
            rc, tail, calls = "timeout", "", 0
        text = log.read_text(errors="replace") if log.exists() else ""
    found = SUMMARY.findall(text)
    kernels = sorted(set(re.findall(r"in (?:void )?([A-Za-z_:]*flash[A-Za-z_:]*)", text)))[:10]
    return {
        "tool": tool,
        "ran": True,
        "shapes": only or "all",
        "calls_made": calls,
        "returncode": rc,
        "seconds": round(time.monotonic() - start, 1),
        "errors": int(found[-1]) if found else None,
        "kernels_named": kernels,
        "report_head": text.splitlines()[:40] if found and int(found[-1]) else [],
        "stdout_tail": tail,
    }


def calls_only(lib: Path, only: list[str] | None) -> None:
    """Under the sanitizer: every shape in every profile, FA2 calls only (no reference, no logging)."""
    import torch

    torch.ops.load_library(str(lib))
    for i, shape in enumerate(selection.SHAPES):
        if only and shape.name not in only:
            continue
        for profile in PROFILES:
            for key in ENV_KEYS:
                os.environ.pop(key, None)
            os.environ.update(profile_env(profile))
            x = make_inputs(torch, shape, 1000 + i)
            try:
                call_fa2(torch, shape, x)
                torch.cuda.synchronize()
                print(f"called {shape.name} {profile}", flush=True)
            except RuntimeError as exc:
                print(f"refused {shape.name} {profile}: {str(exc).splitlines()[0][:200]}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--sanitize", action="store_true")
    parser.add_argument("--initcheck", action="store_true")
    parser.add_argument("--sanitize-timeout", type=int, default=240)
    parser.add_argument("--calls-only", action="store_true")
    parser.add_argument("--build-info", type=Path, help="JSON written by build_fa2.sh, kept in the result")
    parser.add_argument("--ninja-log", type=Path, help="the build's .ninja_log: per-unit compile times, kept too")
    parser.add_argument("--sanitize-only", action="store_true", help="only the sanitizer runs, into --out")
    parser.add_argument("--rejudge", type=Path, help="recompute the verdicts of a result from its recorded launches")
    parser.add_argument("--sanitizer-json", type=Path, action="append", default=[], help="attach (with --rejudge)")
    args = parser.parse_args()
    if args.calls_only:
        calls_only(args.lib, args.only)
        return 0
    if args.sanitize_only:
        tools = ["memcheck", *(["initcheck"] if args.initcheck else [])]
        runs = [sanitize(args.lib, tool, args.sanitize_timeout, args.only) for tool in tools]
        if args.out:
            args.out.write_text(json.dumps({"sanitizer": runs}, indent=1) + "\n")
        print(json.dumps([{k: v for k, v in r.items() if k != "stdout_tail"} for r in runs], indent=1))
        return 0
    report = rejudge(args.rejudge, args.sanitizer_json) if args.rejudge else run_all(args.lib, args.only)
    report["selection_model"] = selection.table()
    report["host"] = {"python": platform.python_version(), "machine": platform.machine()}
    if args.build_info and args.build_info.exists():
        report["build"] = json.loads(args.build_info.read_text())
    if args.sanitize and not args.rejudge:
        report["sanitizer"] = [sanitize(args.lib, "memcheck", args.sanitize_timeout)]
        if args.initcheck:
            report["sanitizer"].append(sanitize(args.lib, "initcheck", args.sanitize_timeout))
    verdicts = [r["pass"] for row in report["results"] for r in row["profiles"].values()]
    memcheck = [s for s in report.get("sanitizer", []) if s.get("tool") == "memcheck"]
    # memcheck is the verdict (the check); initcheck is kept as information (it may not finish in time)
    report["memcheck_clean"] = bool(memcheck) and all(s.get("errors") == 0 for s in memcheck)
    report["all_pass"] = all(verdicts) and report["memcheck_clean"]
    build = report.get("build")
    if isinstance(build, dict) and args.ninja_log and args.ninja_log.exists():
        from collect_native import ninja_units

        build["unit_seconds"] = {Path(k).name.removesuffix(".o"): round(v, 1)
                                 for k, v in sorted(ninja_units([args.ninja_log]).items()) if k.endswith(".cu.o")}
    if isinstance(build, dict) and build.get("library"):
        build["library"] = Path(build["library"]).name  # no machine paths in kept results
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"all_pass={report['all_pass']} ({sum(verdicts)}/{len(verdicts)} shape x profile checks)")
    return 0 if report["all_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
