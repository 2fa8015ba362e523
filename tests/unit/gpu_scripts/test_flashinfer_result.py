"""tests/device/flashinfer_result.py served: vLLM serving on FlashInfer's sampler from the jit-cache, read from the
two runs the device brought back (tests/device/results/flashinfer-served/, the runs as they came, session paths
as $G4S). The recorded result is what the fold makes of them, and each way the runs could fail to show the issue's
point turns its own check false."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

DEVICE = Path(__file__).resolve().parents[2] / "device"
RUNS = DEVICE / "results" / "flashinfer-served"
RESULT = DEVICE / "results" / "flashinfer-sm120.json"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flashinfer_result", DEVICE / "flashinfer_result.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _runs() -> tuple[dict[str, Any], dict[str, Any]]:
    return (json.loads((RUNS / "target-sampler.json").read_text(encoding="utf-8")),
            json.loads((RUNS / "target-sampler-fi.json").read_text(encoding="utf-8")))


def test_the_recorded_section_is_the_fold_of_the_recorded_runs(tmp_path: Path) -> None:
    wheel = tmp_path / "flashinfer_jit_cache-0.6.8.post1+g4jit.576efc38e072-cp39-abi3-linux_x86_64.whl"
    wheel.write_bytes(b"stand-in bytes")
    plain, fi = _runs()
    section, ok = _module().served(plain, fi, [], wheel)
    recorded = json.loads(RESULT.read_text(encoding="utf-8"))
    assert ok and recorded["checks"]["served_sampler_from_aot_no_compile"] is True
    for key in ("vllms_sampler", "flashinfer_sampler", "compiled_during_flashinfer_run", "equal_to_vllms_sampler",
                "checks"):
        assert section[key] == recorded["served"][key], key
    assert section["jit_cache"]["file"] == recorded["served"]["jit_cache"]["file"]
    assert recorded["served"]["flashinfer_sampler"]["tokens"] == 768  # 24 requests x 32 tokens, each run


def _spoil(run: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    run = copy.deepcopy(run)
    *parents, last = path.split(".")
    node = run
    for p in parents:
        node = node[p]
    node[last] = value
    return run


def _flip_first_token(run: dict[str, Any], key: str) -> dict[str, Any]:
    run = copy.deepcopy(run)
    row = run["sampler"][key][0]
    row[0] = row[0] + 1
    return run


@pytest.mark.parametrize(("which", "spoil", "check"), [
    ("fi", lambda r: _spoil(r, "sampler.flashinfer_sampling_so", []), "fi_run_loaded_the_jit_cache"),
    ("fi", lambda r: _spoil(r, "sampler.flashinfer_sampling_so",
                            ["$G4S/fi-ws/.cache/flashinfer/90a/cached_ops/sampling/sampling.so"]),
     "fi_run_loaded_the_jit_cache"),
    ("fi", lambda r: _spoil(r, "env.VLLM_USE_FLASHINFER_SAMPLER", "0"), "fi_run_loaded_the_jit_cache"),
    ("plain", lambda r: _spoil(r, "sampler.flashinfer_sampling_so", ["$G4S/x/sampling.so"]),
     "plain_run_on_vllms_sampler"),
    ("fi", lambda r: _spoil(r, "sampler.equal", False), "top_k1_equals_greedy"),
    ("fi", lambda r: _flip_first_token(r, "top_k1"), "tokens_equal_to_vllms_sampler"),
    ("fi", lambda r: _flip_first_token(r, "greedy"), "tokens_equal_to_vllms_sampler"),
    ("plain", lambda r: _spoil(r, "ok", False), "both_runs_ok"),
])
def test_each_way_to_miss_the_point_fails_its_check(tmp_path: Path, which: str, spoil: Any, check: str) -> None:
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"x")
    plain, fi = _runs()
    if which == "fi":
        fi = spoil(fi)
    else:
        plain = spoil(plain)
    section, ok = _module().served(plain, fi, [], wheel)
    assert not ok and section["checks"][check] is False
    assert [k for k, v in section["checks"].items() if not v] == [check]


def test_a_library_compiled_during_the_run_fails_and_the_cli_says_so(tmp_path: Path) -> None:
    into = tmp_path / "result.json"
    into.write_text(json.dumps({"checks": {"scoped_modules_only": True}}), encoding="utf-8")
    compiled = tmp_path / "compiled.txt"
    compiled.write_text("/root/g4s/fi-ws/.cache/flashinfer/0.6.8.post1/90a/cached_ops/sampling/sampling.so\n")
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"x")
    proc = subprocess.run([sys.executable, str(DEVICE / "flashinfer_result.py"), "served",
                           "--plain", str(RUNS / "target-sampler.json"), "--fi", str(RUNS / "target-sampler-fi.json"),
                           "--compiled", str(compiled), "--jit-cache", str(wheel), "--into", str(into)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr
    written = json.loads(into.read_text(encoding="utf-8"))
    assert written["served"]["checks"]["nothing_compiled"] is False
    assert written["checks"] == {"scoped_modules_only": True, "served_sampler_from_aot_no_compile": False}
    assert written["served"]["compiled_during_flashinfer_run"] == [
        "$WORK/fi-ws/.cache/flashinfer/0.6.8.post1/90a/cached_ops/sampling/sampling.so"]
