"""TRITON_ATTN's unified attention on a verification step (k + 1 query tokens a request), run by Triton's CPU
interpreter through tests/gpu/run_verify_attention.py, the script the GPU run uses: vLLM 0.21.0's split-KV (3D)
kernel, which it launches only for one query token a request, gives the same attention as its 2D kernel and as
torch for up to 16 query tokens, full and sliding-window layers alike. What the GPU run then measures is only
whether it is faster; the series would need no kernel change, only the dispatch and the buffers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.trees import patched_tree, sdist_tree

pytest.importorskip("triton", reason="the kernel check needs triton (its CPU interpreter)")
pytest.importorskip("numpy", reason="Triton's interpreter runs on numpy")

pytestmark = pytest.mark.network

SCRIPT = Path(__file__).resolve().parents[1] / "gpu" / "run_verify_attention.py"


def _run(source: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), "--source", str(source), "--json", *args],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize(("shape", "queries"), [("small", "1,9,16"), ("small-sliding", "5,16")])
def test_the_split_kernel_verifies_as_the_released_one(shape: str, queries: str) -> None:
    proc = _run(patched_tree("vllm-0.21.0"), "--shape", shape, "--queries", queries, "--context", "300")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and report["device"].startswith("cpu")
    for row in report["rows"]:
        # as released, a request of one query token takes the 3D kernel and a verification the 2D one; the
        # experiment takes the 3D kernel for both (seen: only it writes the segment buffers)
        assert row["released_kernel"] == ("3d" if row["query"] == 1 else "2d")
        assert row["3d_kernel"] == "3d"
        assert row["released_ok"] and row["3d_ok"], row
        # the two are different computations (split softmax rounds otherwise), equal within float32 rounding
        assert row["released_vs_3d"] < 1e-5
    assert [r["query"] for r in report["rows"]] == [int(q) for q in queries.split(",")]


def test_a_tree_without_the_released_condition_is_refused() -> None:
    """0.33.0 already lets short queries take the split kernel (its own bound): nothing for the experiment to widen."""
    proc = _run(sdist_tree("vllm-0.33.0"), "--queries", "4")
    assert proc.returncode == 2 and "is not 0.21.0's" in proc.stderr
    missing = _run(Path(__file__).parent, "--queries", "4")  # no vLLM here at all
    assert missing.returncode == 2 and "expected a vLLM source tree" in missing.stderr
