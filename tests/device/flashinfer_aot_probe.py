"""On a GPU, with FlashInfer's JIT made unavailable: the sampler runs from the ahead-of-time jit-cache module.

Run by tests/device/flashinfer_aot_gpu_check.sh (which installs flashinfer-python and the jit-cache wheel, takes
nvcc off PATH, sets FLASHINFER_DISABLE_JIT=1 and an empty FLASHINFER_WORKSPACE_BASE). Calls the three FlashInfer
sampling functions exactly as vLLM's flashinfer_sample does (vllm/v1/sample/ops/topk_topp_sampler.py: per-request
k and p tensors, deterministic=True) and writes a JSON verdict:
- ``sampling`` is found in the jit-cache (``JitSpec.is_aot``) and the loaded library is that file
  (``/proc/self/maps``);
- nothing was compiled: no ``cached_ops`` library under the workspace, nvcc not on PATH;
- with k = 1 every sampler returns the argmax (what greedy decoding returns), p < 1 included;
- with k = 5 every one of 64 draws a row lies in the row's top 5, and each row draws more than one of them.
Usage: python flashinfer_aot_probe.py OUT_JSON [--foreign-arch]
--foreign-arch: the jit-cache is another GPU's (sm_120 on an H200): see ``foreign``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path


def foreign(result: dict[str, object], flashinfer: object, torch: object, spec: object, jit_dir: str) -> int:
    """The jit-cache was built for another GPU (sm_120 on an H200): FlashInfer still takes the ahead-of-time
    library (no JIT compile) and the first kernel call fails with CUDA's "no kernel image", not a crash."""
    logits = torch.randn(2, 1000, device="cuda")  # type: ignore[attr-defined]
    k = torch.ones(2, dtype=torch.int32, device="cuda")  # type: ignore[attr-defined]
    p = torch.full((2,), 0.9, device="cuda")  # type: ignore[attr-defined]
    try:
        flashinfer.sampling.top_k_top_p_sampling_from_logits(logits, k, p, deterministic=True)  # type: ignore[attr-defined]
        torch.cuda.synchronize()  # type: ignore[attr-defined]
        result["call"] = "returned"
    except Exception as e:  # the error is what this mode records
        result["call"] = f"{type(e).__name__}: {str(e)[:300]}"
    loaded = sorted({line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                     if line.endswith("/sampling.so")})
    compiled = sorted(str(x) for x in Path(jit_dir).rglob("*.so")) if Path(jit_dir).exists() else []
    result.update(loaded_sampling_so=loaded, compiled_here=compiled)
    result["ok"] = bool(spec.is_aot and loaded == [str(spec.aot_path)] and not compiled  # type: ignore[attr-defined]
                        and "no kernel image" in str(result["call"]).lower())
    return 0


def main() -> int:
    out = Path(sys.argv[1])
    result: dict[str, object] = {"ok": False, "nvcc_on_path": shutil.which("nvcc"),
                                 "disable_jit": os.environ.get("FLASHINFER_DISABLE_JIT")}
    import flashinfer
    import torch
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.sampling import gen_sampling_module

    spec = gen_sampling_module()
    result.update(flashinfer=flashinfer.__version__, device=torch.cuda.get_device_name(),
                  capability=list(torch.cuda.get_device_capability()), is_aot=spec.is_aot,
                  aot_path=str(spec.aot_path), jit_dir=str(jit_env.FLASHINFER_JIT_DIR))
    if "--foreign-arch" in sys.argv[2:]:
        foreign(result, flashinfer, torch, spec, str(jit_env.FLASHINFER_JIT_DIR))
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
        return 0 if result["ok"] else 1
    torch.manual_seed(0)
    batch, vocab = 8, 32000
    logits = torch.randn(batch, vocab, device="cuda", dtype=torch.float32)
    greedy = logits.argmax(dim=-1)
    k = torch.ones(batch, dtype=torch.int32, device="cuda")
    p = torch.full((batch,), 0.9, dtype=torch.float32, device="cuda")
    start = time.monotonic()
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    samples = {
        "top_k_top_p_sampling_from_logits": flashinfer.sampling.top_k_top_p_sampling_from_logits(
            logits, k, p, deterministic=True),
        "top_k_sampling_from_probs": flashinfer.sampling.top_k_sampling_from_probs(probs, k, deterministic=True),
        "top_p_sampling_from_probs": flashinfer.sampling.top_p_sampling_from_probs(
            probs, torch.full((batch,), 1e-6, device="cuda"), deterministic=True),  # p ~ 0: the top token
    }
    torch.cuda.synchronize()
    result["first_call_s"] = round(time.monotonic() - start, 3)  # a JIT compile would take minutes
    result["equal_to_argmax"] = {name: bool(torch.equal(ids.view(-1).long(), greedy)) for name, ids in samples.items()}
    # k = 1 cannot tell a sampler from an argmax: with k = 5, every draw must lie in the row's top 5, and 64
    # draws a row (not deterministic) must find more than one of them
    k5 = torch.full((batch,), 5, dtype=torch.int32, device="cuda")
    top5 = logits.topk(5, dim=-1).indices
    draws = torch.stack([flashinfer.sampling.top_k_sampling_from_probs(probs, k5, deterministic=False).view(-1).long()
                         for _ in range(64)], dim=1)
    torch.cuda.synchronize()
    within = bool((draws.unsqueeze(-1) == top5.unsqueeze(1)).any(-1).all())
    distinct = [len(set(row.tolist())) for row in draws]
    result["top_k5"] = {"within_top5": within, "distinct_per_row": distinct}
    maps = Path("/proc/self/maps").read_text().splitlines()
    loaded = sorted({line.split()[-1] for line in maps if line.endswith("/sampling.so")})
    result["loaded_sampling_so"] = loaded
    compiled = sorted(str(p) for p in Path(jit_env.FLASHINFER_JIT_DIR).rglob("*.so")) \
        if Path(jit_env.FLASHINFER_JIT_DIR).exists() else []
    result["compiled_here"] = compiled
    result["ok"] = bool(spec.is_aot and loaded and all(str(Path(x)) == str(Path(spec.aot_path)) for x in loaded)
                        and not compiled and all(result["equal_to_argmax"].values())  # type: ignore[union-attr]
                        and within and min(distinct) > 1)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
