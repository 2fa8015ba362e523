"""The DFlash input-expansion Triton kernel of the patched trees, run by Triton's CPU interpreter (TRITON_INTERPRET=1)
on a padded batch (17 real requests, block table padded to 24 rows) with rejected drafts, against a plain-Python
reference, and its cache writes replayed in the proposer's order: why the series has no patch for rejected context
rows (its 0002 was dropped in version 2).

The kernel runs in a subprocess through tests/gpu/run_dflash_kernel.py, the same check the GPU run uses, so the
interpreter flag is set before triton is imported and nothing leaks into this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.trees import sdist_tree

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
    """Slots, positions, ids and sample indices as the reference says; rejected context rows do get their slots
    (K/V written), yet the draft attention reads exactly what it would read if they wrote nothing, because the
    same step's query rows overwrite those positions before any draft layer attends. The script also replays the
    writes in the other order and must then see the rejected rows, so the comparison is not blind."""
    rc, report = _run(patched_path / KERNEL_FILE, seeds=2)
    failures = {
        f"seed {run['seed']} {name}": verdict
        for run in report["runs"]
        for name, verdict in run["checks"].items()
        if verdict != "ok"
    }
    assert rc == 0 and report["ok"], failures
    assert report["device"] == "cpu"
    for run in report["runs"]:
        assert {"draft_reads_same_without_rejected_writes", "replay_sees_rejected_writes_in_other_order"} <= set(
            run["checks"]
        )


def test_series_leaves_the_kernel_as_released(patched_path: Path, pin: str) -> None:
    """With 0002 dropped the series does not touch the kernel's file: the checks above are on the kernel each
    release ships."""
    assert (patched_path / KERNEL_FILE).read_bytes() == (sdist_tree(pin) / KERNEL_FILE).read_bytes()
