"""On a GPU, with FlashInfer's JIT made unavailable: the sampler runs from the ahead-of-time jit-cache module.

Run by tests/device/flashinfer_aot_gpu_check.sh (which installs flashinfer-python and the jit-cache wheel, takes
nvcc off PATH, sets FLASHINFER_DISABLE_JIT=1 and an empty FLASHINFER_WORKSPACE_BASE). Calls the three FlashInfer
sampling functions exactly as vLLM's flashinfer_sample does (vllm/v1/sample/ops/topk_topp_sampler.py: per-request
k and p tensors, deterministic=True) and writes a JSON verdict:
- ``sampling`` is found in the jit-cache (``JitSpec.is_aot``) and the loaded library is that file
  (``/proc/self/maps``);
- nothing was compiled: no ``cached_ops`` library under the workspace, nvcc not on PATH;
- with k = 1 every sampler returns the argmax (what greedy decoding returns), p < 1 included.
Usage: python flashinfer_aot_probe.py OUT_JSON
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path


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
    maps = Path("/proc/self/maps").read_text().splitlines()
    loaded = sorted({line.split()[-1] for line in maps if line.endswith("/sampling.so")})
    result["loaded_sampling_so"] = loaded
    compiled = sorted(str(p) for p in Path(jit_env.FLASHINFER_JIT_DIR).rglob("*.so")) \
        if Path(jit_env.FLASHINFER_JIT_DIR).exists() else []
    result["compiled_here"] = compiled
    result["ok"] = bool(spec.is_aot and loaded and all(str(Path(x)) == str(Path(spec.aot_path)) for x in loaded)
                        and not compiled and all(result["equal_to_argmax"].values()))  # type: ignore[union-attr]
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
