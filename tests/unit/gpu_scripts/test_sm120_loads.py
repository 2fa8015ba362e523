"""tests/device/sm120_wheel_loads.py's verdicts on a kernel call: on a GPU an sm_120-only library has no image
for, a kernel either raises CUDA's "no kernel image" (FA2 checks its launch) or returns as if it had run while
its output stays unwritten (vLLM's rms_norm does not check its launch). The second must never read as a pass."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

DEVICE = Path(__file__).resolve().parents[2] / "device"
sys.path.insert(0, str(DEVICE))

import sm120_wheel_loads as loads  # noqa: E402


def test_a_kernel_that_returns_without_running_is_named_not_passed() -> None:
    kernel = {"rms_norm": {"ok": False, "raised": False, "wrote_output": False, "cuda_last_error": 209},
              "fa2_varlen": {"ok": False, "raised": True, "error": "AcceleratorError: CUDA error: no kernel image "
                                                                   "is available for execution on the device"}}
    assert loads.kernel_verdicts(kernel) == (["fa2_varlen"], ["rms_norm"])
    ran = {"rms_norm": {"ok": True, "raised": False, "wrote_output": True, "cuda_last_error": 0}}
    assert loads.kernel_verdicts(ran) == ([], [])
    other = {"fa2_varlen": {"ok": False, "raised": True, "error": "RuntimeError: out of memory"}}
    assert loads.kernel_verdicts(other) == ([], [])
    assert loads.kernel_verdicts(None) == ([], []) and loads.kernel_verdicts({"rc": 1, "stderr": "x"}) == ([], [])


def test_the_kernel_check_compares_values_and_starts_from_nan() -> None:
    """The snippet the GPU runs: valid Python that fills the output with NaN and compares it with torch's
    rms_norm, so an unwritten output cannot pass (the first hold's check only waited for an exception)."""
    tree = ast.parse(loads.KERNEL)
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert {"torch.full_like", "torch.allclose", "torch.isfinite", "torch.ops._C.rms_norm"} <= calls
    assert 'float("nan")' in loads.KERNEL or "float('nan')" in loads.KERNEL


def test_load_refuses_to_run_without_vllms_runtime_deps(tmp_path: Path) -> None:
    """A hold that did not carry the e2e deps must not record `vllm serve --help` as failing: the load step
    stops first, naming what to carry (exit 8)."""
    import os
    import subprocess

    g4s = tmp_path / "g4s"
    (g4s / "work-sm120" / "wheels").mkdir(parents=True)
    (g4s / "work-sm120" / "wheels" / "vllm-0.21.0+cu130.g4.0123456789-cp310-abi3-manylinux_2_38_x86_64.whl") \
        .write_bytes(b"PK")
    env = dict(os.environ, G4S=str(g4s), G4_BUILDS="sm120", OUT=str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    done = subprocess.run(["bash", str(DEVICE / "wheel_runs_session.sh"), "load"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 8, done.stdout + done.stderr
    assert "carry .whl and .device/serve-whl" in done.stdout and not any((tmp_path / "out").iterdir())
