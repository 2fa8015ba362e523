"""The sm_120 wheel `g4build wheel` built, loaded on a GPU that cannot run its kernels (an H200, sm_90): every
extension module imports against the pin's torch, `vllm serve --help` and vLLM's environment collection run, and
a kernel call fails with CUDA's "no kernel image" error, not a crash or a hang. What it shows: no missing symbol,
no extension that fails to load, no Python file the series changed that breaks at import, a version string vLLM
accepts. What it cannot show: that the sm_120 kernels compute the right thing (only an SM120 card can).

    python tests/device/sm120_wheel_loads.py WHEEL --work DIR --json OUT.json

Run with PYTHONPATH naming vLLM's runtime dependencies (tests/gpu/e2e's deps and serve deps). Each check runs in
its own Python process with a time limit, so a crash or a hang is recorded as such.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

EXTENSIONS = ("vllm._C", "vllm._moe_C", "vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa2_C",
              "vllm.cumem_allocator")

IMPORT = """
import importlib, json, sys
import torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(),
       "capability": list(torch.cuda.get_device_capability())}
for name in sys.argv[1:]:
    try:
        m = importlib.import_module(name)
        out[name] = {"ok": True, "file": m.__file__.rsplit("/", 2)[-2] + "/" + m.__file__.rsplit("/", 1)[-1]}
    except Exception as exc:
        out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:800]}
import vllm
out["vllm"] = vllm.__version__
print(json.dumps(out))
"""

# A kernel of _C on the GPU at hand: rms_norm as vLLM calls it. On sm_90 an sm_120-only library has no image. vLLM
# launches it without checking the launch, so "no error" proves nothing: the output starts as NaN and is compared
# with torch's own rms_norm, and CUDA's last error (cleared by reading it) is read from the runtime torch loaded.
KERNEL = """
import ctypes, json, torch
import vllm._C  # noqa: F401  registers torch.ops._C

def last_error():
    lib = next((ln.split()[-1] for ln in open("/proc/self/maps") if "libcudart.so" in ln), None)
    return None if lib is None else int(ctypes.CDLL(lib).cudaGetLastError())

res = {}
x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
w = torch.rand(256, device="cuda", dtype=torch.bfloat16) + 0.5
want = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)
out = torch.full_like(x, float("nan"))
last_error()
try:
    torch.ops._C.rms_norm(out, x, w, 1e-6)
    torch.cuda.synchronize()
    wrote = bool(torch.isfinite(out).all())
    res["rms_norm"] = {"ok": wrote and bool(torch.allclose(out.float(), want.float(), atol=2e-2, rtol=2e-2)),
                       "raised": False, "wrote_output": wrote, "cuda_last_error": last_error()}
    if not res["rms_norm"]["ok"]:
        how = "wrote a wrong result" if wrote else "left its output unwritten"
        code = res["rms_norm"]["cuda_last_error"]
        res["rms_norm"]["error"] = f"returned without an error but {how} (cudaGetLastError {code}; 209: no image)"
except Exception as exc:
    res["rms_norm"] = {"ok": False, "raised": True, "error": f"{type(exc).__name__}: {exc}"[:600]}
try:
    from vllm.vllm_flash_attn import flash_attn_varlen_func
    q = torch.randn(8, 4, 128, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 8], device="cuda", dtype=torch.int32)
    flash_attn_varlen_func(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=8, max_seqlen_k=8, causal=True)
    torch.cuda.synchronize()
    res["fa2_varlen"] = {"ok": True, "raised": False}
except Exception as exc:
    res["fa2_varlen"] = {"ok": False, "raised": True, "error": f"{type(exc).__name__}: {exc}"[:600]}
print(json.dumps(res))
"""


def run(argv: list[str], env: dict[str, str], limit: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        return {"rc": None, "hung": True, "seconds": limit}
    return {"rc": p.returncode, "seconds": round(time.perf_counter() - t0, 1), "stdout": p.stdout[-3000:],
            "stderr": p.stderr[-3000:]}


def last_json(text: str) -> Any:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def kernel_verdicts(kernel: Any) -> tuple[list[str], list[str]]:
    """The kernels that raised CUDA's "no kernel image", and those that returned as if they had run but left their
    output unwritten or wrong (a launch nobody checked)."""
    items = [(k, v) for k, v in (kernel or {}).items() if isinstance(v, dict)] if isinstance(kernel, dict) else []
    no_image = sorted(k for k, v in items if v.get("raised") and "no kernel image" in str(v.get("error", "")))
    silent = sorted(k for k, v in items if not v.get("ok") and v.get("raised") is False)
    return no_image, silent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    site = args.work / "site"
    res: dict[str, Any] = {"wheel": {"file": args.wheel.name,
                                     "sha256": hashlib.sha256(args.wheel.read_bytes()).hexdigest(),
                                     "bytes": args.wheel.stat().st_size}}
    with zipfile.ZipFile(args.wheel) as z:
        name = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/build-manifest.json"))
        res["wheel"]["manifest_digest"] = json.loads(z.read(name)).get("digest")
    if not site.is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                        str(site), str(args.wheel)], check=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
               PYTHONUNBUFFERED="1", VLLM_USE_FLASHINFER_SAMPLER="0")
    imp = run([sys.executable, "-c", IMPORT, *EXTENSIONS], env, 300)
    res["imports"] = last_json(imp.get("stdout", "")) or imp
    res["serve_help"] = run([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "--help"], env, 300)
    res["serve_help"]["stdout"] = res["serve_help"].get("stdout", "")[-600:]
    res["collect_env"] = run([sys.executable, "-m", "vllm.collect_env"], env, 300)
    kern = run([sys.executable, "-c", KERNEL], env, 300)
    res["kernel"] = last_json(kern.get("stdout", "")) or kern
    imports_ok = isinstance(res["imports"], dict) and all(res["imports"].get(e, {}).get("ok") for e in EXTENSIONS)
    no_image, silent = kernel_verdicts(res["kernel"])
    res["checks"] = {
        "extensions_import": imports_ok,
        "serve_help_rc0": res["serve_help"].get("rc") == 0,
        "collect_env_rc0": res["collect_env"].get("rc") == 0,
        "kernel_says_no_kernel_image": no_image,
        "kernel_returned_without_running": silent,
        "no_crash_no_hang": kern.get("rc") == 0,
    }
    # tracebacks name the session folder: written as $G4S, no machine path in a result
    args.json.write_text(re.sub(r"/(?:root|home/[\w.-]+)/g4s/", "$G4S/", json.dumps(res, indent=1)) + "\n")
    print(json.dumps(res["checks"]))
    return 0 if imports_ok and res["checks"]["serve_help_rc0"] and no_image else 1


if __name__ == "__main__":
    raise SystemExit(main())
