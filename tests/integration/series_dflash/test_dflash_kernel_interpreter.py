"""The patched DFlash input-expansion Triton kernel, run by Triton's CPU interpreter (TRITON_INTERPRET=1) on a padded
batch (17 real requests, block table padded to 24 rows) with rejected drafts, against a plain-Python reference.

The kernel runs in a subprocess through tests/gpu/run_dflash_kernel.py, the same check the GPU run uses, so the
interpreter flag is set before triton is imported and nothing leaks into this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the kernel check needs triton (its CPU interpreter)")
pytest.importorskip("numpy", reason="Triton's interpreter runs on numpy")

pytestmark = pytest.mark.network

SCRIPT = Path(__file__).resolve().parents[2] / "gpu" / "run_dflash_kernel.py"
KERNEL_FILE = "vllm/v1/spec_decode/utils.py"


def _run(kernel_source: Path, seeds: int) -> tuple[int, dict]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--kernel-source",
            str(kernel_source),
            "--device",
            "cpu",
            "--json",
            "--seeds",
            str(seeds),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode in (0, 1), f"kernel check crashed (rc={out.returncode}):\n{out.stderr[-4000:]}"
    return out.returncode, json.loads(out.stdout)


def test_patched_kernel_matches_reference_on_padded_batch(patched_path: Path) -> None:
    rc, report = _run(patched_path / KERNEL_FILE, seeds=2)
    failures = {
        f"seed {run['seed']} {name}": verdict
        for run in report["runs"]
        for name, verdict in run["checks"].items()
        if verdict != "ok"
    }
    assert rc == 0 and report["ok"], failures
    assert report["device"] == "cpu"


def test_unpatched_kernel_writes_rejected_slots(pristine_021_path: Path) -> None:
    """Negative control: 0.21.0 as released writes rejected rows' K/V, and only that check fails; its query
    positions already come from the last accepted token."""
    rc, report = _run(pristine_021_path / KERNEL_FILE, seeds=1)
    assert rc == 1 and not report["ok"]
    (run,) = report["runs"]
    failed = {name for name, verdict in run["checks"].items() if verdict != "ok"}
    assert failed == {"rejected_context_slots_unwritten"}, run["checks"]
