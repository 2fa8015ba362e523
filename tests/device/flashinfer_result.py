"""Fold the FlashInfer ahead-of-time device runs into ``tests/device/results/flashinfer-sm120.json`` (issue 51):
the scoped sm_120 build (``g4build flashinfer-aot --arch 12.0f`` on the GPU machine: modules, cubin archs,
seconds, bytes, validate), its sm_90 twin's sampler on the H200 with FlashInfer's JIT unavailable
(``flashinfer_aot_probe.py``), and the sm_120 wheel loaded on the H200 (``--foreign-arch``).

    python tests/device/flashinfer_result.py --record R/flashinfer-aot.json --log R/aot.log \\
        --validate V/validate-sm120.json --wheel V/jit-cache-sm120.whl.zip --wheel-name V/wheel-name.txt \\
        --sm90-record sm90/flashinfer-aot.json --gpu G/flashinfer-aot-gpu.json \\
        --foreign F/flashinfer-aot-sm120-on-h200.json --machine "..." --out tests/device/results/flashinfer-sm120.json

Each input is what a device call brought back (the commands are in tests/device/README.md); nothing is typed in
by hand but the machine's description.

``served`` adds vLLM serving on that sampler (``wheel_runs_session.sh flashinfer``: the built sm_90 vLLM wheel, the
trained tiny target, vLLM's own sampler, then FlashInfer's from the jit-cache with its JIT unavailable) to a result
folded before:

    python tests/device/flashinfer_result.py served --plain R/target-sampler.json --fi R/target-sampler-fi.json \\
        --compiled R/flashinfer-compiled.txt --jit-cache .device/fi/wh/flashinfer_jit_cache-*.whl \\
        --into tests/device/results/flashinfer-sm120.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

PUBLISHED_FULL_MB = 189  # upstream's flashinfer-jit-cache for sm120f, every module (FlashInfer's own index)


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def wheel_facts(wheel: Path, name: str) -> dict[str, Any]:
    with zipfile.ZipFile(wheel) as z:
        libs = {i.filename: i.file_size for i in z.infolist() if i.filename.endswith(".so")}
    return {"file": name, "bytes": wheel.stat().st_size, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            "libraries": libs}


def cubin_archs(validate: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for wheel in validate.get("wheels", []):
        for check in wheel.get("checks", []):
            m = re.match(r"arch (sm_\d+\w*) .*/([^/]+\.so)$", check.get("name", ""))
            if m:
                out[m[2]] = check.get("detail", "")
    return out


def fold(a: argparse.Namespace) -> dict[str, Any]:
    record, validate = _json(a.record), _json(a.validate)
    gpu, foreign, sm90 = _json(a.gpu), _json(a.foreign), _json(a.sm90_record)
    log = a.log.read_text(encoding="utf-8")
    command_s = re.search(r"command: (\d+) s", log)
    wheel = wheel_facts(a.wheel, a.wheel_name.read_text(encoding="utf-8").strip())
    validate_ok = all(c.get("ok") for w in validate.get("wheels", []) for c in w.get("checks", []))
    return {
        "what": "FlashInfer modules the recipes load, compiled ahead of time by g4build flashinfer-aot",
        "machine": a.machine,
        "scoped_sm120": {
            "command": "g4build flashinfer-aot --pin vllm-0.21.0 --arch 12.0f --jobs 16",
            "flashinfer": record["flashinfer"], "sdist_sha256": record["sdist"]["sha256"],
            "modules": record["modules"], "module_archs": record["module_archs"],
            "compile_seconds": record["seconds"],
            "command_seconds": int(command_s[1]) if command_s else None,
            "library_bytes": record["bytes"],
            "wheel_of_that_run": record["wheels"][0],
            "rebuilt_wheel": wheel,
            "validate_ok": validate_ok, "cubins": cubin_archs(validate),
            "against_published_full": {"published_full_mb": PUBLISHED_FULL_MB,
                                       "scoped_mb": round(wheel["bytes"] / 1e6, 1),
                                       "ratio": round(PUBLISHED_FULL_MB / (wheel["bytes"] / 1e6), 1)},
        },
        "sm90_twin": {"command": "g4build flashinfer-aot --pin vllm-0.21.0 --arch 9.0 --jobs 2 (built on 2 CPU cores)",
                      "modules": sm90["modules"], "module_archs": sm90["module_archs"],
                      "skipped": sm90["skipped"], "compile_seconds": sm90["seconds"], "wheels": sm90["wheels"]},
        "sampler_without_jit": gpu,
        "sm120_wheel_on_h200": foreign,
        "checks": {
            "scoped_modules_only": sorted(record["modules"]) == sorted(record["bytes"]),
            "sm120_validate_ok": validate_ok,
            "sampler_from_aot_no_compile": bool(gpu.get("ok")),
            "sm120_wheel_fails_cleanly_on_other_gpu": bool(foreign.get("ok")),
        },
    }


JIT_CACHE_DIR = "/flashinfer_jit_cache/jit_cache/"  # where a jit-cache wheel's libraries sit once installed


def _sampler_run(run: dict[str, Any]) -> dict[str, Any]:
    sampler = run.get("sampler") or {}
    return {"vllm": run.get("versions", {}).get("vllm"), "ok": run.get("ok"),
            "VLLM_USE_FLASHINFER_SAMPLER": run.get("env", {}).get("VLLM_USE_FLASHINFER_SAMPLER"),
            "requests": len(sampler.get("ids", [])), "tokens": sum(len(t) for t in sampler.get("greedy", [])),
            "greedy_equal_top_k1": sampler.get("equal"), "sampling_so_mapped": sampler.get("flashinfer_sampling_so"),
            # vLLM's calls of flashinfer_sample during each phase's requests (None: a run before they were counted)
            "flashinfer_sample_calls": sampler.get("flashinfer_sample_calls"), "seeded": sampler.get("seeded", True),
            "top_k5": _draws(sampler.get("top_k5_ranks"), sampler.get("top_k5_margins"))}


def _draws(ranks: list[list[int | None]] | None,
           margins: list[list[float | None]] | None = None) -> dict[str, Any] | None:
    """top_k=5 draws: how many, the worst rank among the logits (a draw vLLM gave no rank counts as the worst),
    how many were not the argmax, and, where the run recorded each draw's logprob less the fifth largest, how many
    fell outside the top 5 and how many sat tied with the fifth. vLLM gives a draw that torch.topk returned its
    position there (1-5), and any other its count of tokens at least as likely (ops/logprobs.py: `x >= value`), so
    a draw tied with the fifth that topk left out reads as 6 or worse: a rank alone decides only when it is 5 or
    better."""
    flat = [r for row in ranks or [] for r in row]
    if not flat:
        return None
    known = [r for r in flat if r is not None]
    worst = max(known) if known and len(known) == len(flat) else None
    out: dict[str, Any] = {"tokens": len(flat), "without_rank": len(flat) - len(known), "worst_rank": worst,
                           "not_argmax": sum(r > 1 for r in known), "margins_recorded": margins is not None}
    if margins is not None:
        m = [x for row in margins for x in row]
        if len(m) != len(flat):  # not one margin a draw: none of them counts
            m = [None] * len(flat)
        out.update(without_margin=sum(x is None for x in m), outside_top_5=sum(x is not None and x < 0 for x in m),
                   rank_over_5_tied_with_fifth=sum(r is not None and r > 5 and x == 0 for r, x in zip(flat, m,
                                                                                                      strict=True)))
    return out


def _in_top_5(draws: dict[str, Any] | None, baseline: dict[str, Any] | None = None) -> bool | None:
    """Every top_k=5 draw in the top 5: decided by the margins where recorded, else by the ranks when every rank is
    5 or better. With ranks alone and some over 5, None (undecided) only where vLLM's own sampler in the same run
    drew as far down (whose top-k keeps no token below the fifth logit, so its rank over 5 is a tie); worse
    than that is a draw outside the top 5: False."""
    if draws is None or draws["without_rank"]:
        return False
    if draws["margins_recorded"]:
        return not draws["without_margin"] and not draws["outside_top_5"]
    if draws["worst_rank"] <= 5:
        return True
    own = (baseline or {}).get("worst_rank")
    return None if own is not None and own > 5 and draws["worst_rank"] <= own else False


def _why_undecided(plain_draws: dict[str, Any] | None) -> str:
    why = ("the run recorded ranks alone, and vLLM's rank counts every token at least as likely (ops/logprobs.py "
           "`x >= value`) unless torch.topk returned it: a draw tied with the fifth that topk left out reads as 6 "
           "or worse.")
    worst = (plain_draws or {}).get("worst_rank")
    if worst is not None and worst > 5:
        why += (f" vLLM's own sampler, whose top-k keeps no token below the k-th logit, drew rank {worst} in the "
                "same run, which only a tie explains (the logprobs are a monotone map of the same logits).")
    return why + " A later run records each draw's logprob less the fifth largest (acceptance_runs.phase_sampler)."


def served(plain_run: dict[str, Any], fi_run: dict[str, Any], compiled: list[str],
           jit_cache: Path) -> tuple[dict[str, Any], bool]:
    """The served section and whether it shows what issue 51 asks: FlashInfer's sampler loaded from the
    jit-cache (and only in the run that asked for it), nothing compiled, the same tokens as vLLM's own sampler."""
    plain, fi = _sampler_run(plain_run), _sampler_run(fi_run)
    ps, fs = plain_run.get("sampler") or {}, fi_run.get("sampler") or {}
    same = {name: bool(ps.get(name)) and ps.get(name) == fs.get(name) for name in ("greedy", "top_k1")}
    libs = fi["sampling_so_mapped"] or []
    checks = {
        "both_runs_ok": plain["ok"] is True and fi["ok"] is True,
        "plain_run_on_vllms_sampler": plain["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and not plain["sampling_so_mapped"],
        "fi_run_loaded_the_jit_cache": fi["VLLM_USE_FLASHINFER_SAMPLER"] == "1" and bool(libs)
        and all(JIT_CACHE_DIR in lib for lib in libs),
        "nothing_compiled": not compiled,
        "top_k1_equals_greedy": fi["greedy_equal_top_k1"] is True,
        "tokens_equal_to_vllms_sampler": all(same.values()),
        # a mapped library is not a sampled request: vLLM's warm-up calls FlashInfer once, and seeded requests are
        # sampled natively; FlashInfer must have been called during the top_k=1 requests, and never without the flag
        "flashinfer_sampled_the_requests": fi["seeded"] is False
        and bool((fi["flashinfer_sample_calls"] or {}).get("top_k1"))
        and bool((fi["flashinfer_sample_calls"] or {}).get("top_k5"))
        and plain["flashinfer_sample_calls"] is not None and not any(plain["flashinfer_sample_calls"].values()),
        # top_k=1 cannot tell a sampler from an argmax: top_k=5 draws are not all the argmax, and stay in the top 5
        "top_k5_not_all_argmax": fi["top_k5"] is not None and fi["top_k5"]["not_argmax"] > 0,
        "top_k5_draws_in_the_top_5": _in_top_5(fi["top_k5"], plain["top_k5"]),
    }
    undecided = [k for k, v in checks.items() if v is None]
    section = {
        "command": "wheel_runs_session.sh flashinfer .device/fi (run_e2e.sh acc:target:sampler, then again with "
                   "VLLM_USE_FLASHINFER_SAMPLER=1, FLASHINFER_DISABLE_JIT=1, no nvcc on PATH, an empty workspace)",
        "jit_cache": {"file": jit_cache.name, "sha256": hashlib.sha256(jit_cache.read_bytes()).hexdigest()},
        "vllms_sampler": plain, "flashinfer_sampler": fi, "compiled_during_flashinfer_run": compiled,
        "equal_to_vllms_sampler": same, "checks": checks, "undecided": undecided,
        "undecided_why": {"top_k5_draws_in_the_top_5": _why_undecided(plain["top_k5"])}
        if undecided else {},
        "finding": None if checks["flashinfer_sampled_the_requests"] else (
            "FlashInfer did not sample these requests: they carried a seed (the runs predate the call count), and "
            "vLLM 0.21.0 samples a request with its own generator natively (topk_topp_sampler.py forward_cuda); "
            "sampling.so was loaded by vLLM's warm-up sampler run, which has no per-request generators. Both "
            "runs' tokens came from vLLM's own sampler."
            if fi["seeded"] or fi["flashinfer_sample_calls"] is None else
            "FlashInfer was not called during the top_k=1 requests, or was called without the flag"),
        "cannot_show": "that the draws follow the distribution's proportions (top_k=5 shows they are not all the "
                       "argmax" + (", and that they stay in the top 5" if checks["top_k5_draws_in_the_top_5"]
                                   else "; whether they stay in the top 5 is undecided here") +
                       "; the direct probe, sampler_without_jit, the same). The tiny model's vocabulary is small.",
    }
    # an undecided check does not pass the section, nor fail it: it is named under `undecided`
    return section, all(v is not False for v in checks.values()) and all(
        v is True for k, v in checks.items() if k != "top_k5_draws_in_the_top_5")


def served_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="flashinfer_result.py served")
    for name in ("plain", "fi", "compiled", "jit-cache", "into"):
        ap.add_argument(f"--{name}", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        result = _json(a.into)
        compiled = [line for line in a.compiled.read_text(encoding="utf-8").splitlines() if line.strip()]
        section, ok = served(_json(a.plain), _json(a.fi), compiled, a.jit_cache)
    except (OSError, ValueError, AttributeError) as e:
        print(f"flashinfer_result served: {e}", file=sys.stderr)
        return 1
    result["served"] = section
    result["checks"]["served_sampler_from_aot_no_compile"] = ok
    text = re.sub(r"/(?:tmp|root)/[A-Za-z0-9_.-]+", "$WORK", json.dumps(result, indent=1))
    a.into.write_text(text + "\n", encoding="utf-8")
    print(json.dumps(section["checks"]))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["served"]:
        return served_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("record", "log", "validate", "wheel", "wheel-name", "sm90-record", "gpu", "foreign", "out"):
        ap.add_argument(f"--{name}", type=Path, required=True)
    ap.add_argument("--machine", required=True)
    a = ap.parse_args(argv)
    try:
        result = fold(a)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        print(f"flashinfer_result: {e}", file=sys.stderr)
        return 1
    # the device machine's scratch folders (the probe's venv-less site, the build's output) as names, not paths
    text = re.sub(r"/(?:tmp|root)/[A-Za-z0-9_.-]+", "$WORK", json.dumps(result, indent=1))
    a.out.write_text(text + "\n", encoding="utf-8")
    print(json.dumps(result["checks"]))
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
