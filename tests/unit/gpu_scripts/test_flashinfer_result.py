"""tests/device/flashinfer_result.py served: vLLM serving on FlashInfer's sampler from the jit-cache, read from the
two runs the device brought back (tests/device/results/flashinfer-served/, the runs as they came, session paths
as $G4S). The recorded result is what the fold makes of them: those runs did not show the point (their requests carried
a seed, which vLLM 0.21.0 samples natively), and the fold says so. Each way a run can fail to show it turns its own
check false, from runs that counted vLLM's calls of FlashInfer's sampler as phase_sampler now does."""

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
    for key in ("vllms_sampler", "flashinfer_sampler", "compiled_during_flashinfer_run", "equal_to_vllms_sampler",
                "checks", "finding"):
        assert section[key] == recorded["served"][key], key
    assert section["jit_cache"]["file"] == recorded["served"]["jit_cache"]["file"]
    assert recorded["served"]["flashinfer_sampler"]["tokens"] == 768  # 24 requests x 32 tokens, each run
    # the library was mapped and the tokens agree, yet FlashInfer sampled none of the requests: not shown
    assert not ok and recorded["checks"]["served_sampler_from_aot_no_compile"] is False
    assert [k for k, v in section["checks"].items() if not v] == ["flashinfer_sampled_the_requests",
                                                                   "top_k5_draws_in_the_top_5"]
    assert "carried a seed" in section["finding"]


def _counted(plain: dict[str, Any], fi: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded runs as phase_sampler now writes them: no seed, vLLM's calls of flashinfer_sample counted
    (none for greedy requests, which never reach the sampler; one a step for top_k=1)."""
    plain, fi = copy.deepcopy(plain), copy.deepcopy(fi)
    draws = [[1] * 30 + [2, 4] for _ in range(24)]  # ranks of 32 top_k=5 draws a request
    plain["sampler"].update(flashinfer_sample_calls={"greedy": 0, "top_k1": 0, "top_k5": 0}, seeded=False,
                            top_k5_ranks=draws)
    fi["sampler"].update(flashinfer_sample_calls={"greedy": 0, "top_k1": 32, "top_k5": 32}, seeded=False,
                         top_k5_ranks=draws)
    return plain, fi


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
    ("fi", lambda r: _spoil(r, "sampler.flashinfer_sample_calls", {"greedy": 0, "top_k1": 0}),
     "flashinfer_sampled_the_requests"),
    ("fi", lambda r: _spoil(r, "sampler.seeded", True), "flashinfer_sampled_the_requests"),
    ("plain", lambda r: _spoil(r, "sampler.flashinfer_sample_calls", {"greedy": 0, "top_k1": 3, "top_k5": 0}),
     "flashinfer_sampled_the_requests"),
    ("fi", lambda r: _spoil(r, "sampler.flashinfer_sample_calls", {"greedy": 0, "top_k1": 32, "top_k5": 0}),
     "flashinfer_sampled_the_requests"),
    ("fi", lambda r: _spoil(r, "sampler.top_k5_ranks", [[1] * 32 for _ in range(24)]), "top_k5_draws_in_the_top_5"),
    ("fi", lambda r: _spoil(r, "sampler.top_k5_ranks", [[1] * 31 + [6] for _ in range(24)]),
     "top_k5_draws_in_the_top_5"),
    ("fi", lambda r: _spoil(r, "sampler.top_k5_ranks", []), "top_k5_draws_in_the_top_5"),
    ("fi", lambda r: _spoil(r, "sampler.top_k5_ranks", [[1] * 30 + [2, None] for _ in range(24)]),
     "top_k5_draws_in_the_top_5"),
])
def test_each_way_to_miss_the_point_fails_its_check(tmp_path: Path, which: str, spoil: Any, check: str) -> None:
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"x")
    plain, fi = _counted(*_runs())
    assert _module().served(plain, fi, [], wheel)[1]  # the counted runs pass
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
    plain, fi = _counted(*_runs())
    (tmp_path / "plain.json").write_text(json.dumps(plain), encoding="utf-8")
    (tmp_path / "fi.json").write_text(json.dumps(fi), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(DEVICE / "flashinfer_result.py"), "served",
                           "--plain", str(tmp_path / "plain.json"), "--fi", str(tmp_path / "fi.json"),
                           "--compiled", str(compiled), "--jit-cache", str(wheel), "--into", str(into)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr
    written = json.loads(into.read_text(encoding="utf-8"))
    assert written["served"]["checks"]["nothing_compiled"] is False
    assert written["checks"] == {"scoped_modules_only": True, "served_sampler_from_aot_no_compile": False}
    assert written["served"]["compiled_during_flashinfer_run"] == [
        "$WORK/fi-ws/.cache/flashinfer/0.6.8.post1/90a/cached_ops/sampling/sampling.so"]


class _Logprob:
    def __init__(self, rank: int) -> None:
        self.rank = rank


def test_phase_sampler_counts_vllms_calls_per_phase_and_sends_no_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """acceptance_runs.phase_sampler against a stand-in for vLLM's engine (no GPU here) shaped like vLLM 0.21.0's
    sampler: forward_cuda looks `flashinfer_sample` up in topk_topp_sampler at each call and takes the native path
    for greedy requests and for requests with a seed (their own generator). The phase counts the calls per phase,
    puts the original function back, sends no seed, and reads the top_k=5 draws' ranks."""
    import types

    from .test_acceptance import _load

    tts = types.ModuleType("vllm.v1.sample.ops.topk_topp_sampler")

    def flashinfer_sample(*args: Any) -> str:
        return "sampled"

    tts.flashinfer_sample = flashinfer_sample  # type: ignore[attr-defined]
    vllm = types.ModuleType("vllm")

    class SamplingParams:
        def __init__(self, **kw: Any) -> None:
            self.kw = kw

    vllm.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    for name, mod in {"vllm": vllm, "vllm.v1": types.ModuleType("vllm.v1"),
                      "vllm.v1.sample": types.ModuleType("vllm.v1.sample"),
                      "vllm.v1.sample.ops": types.ModuleType("vllm.v1.sample.ops"),
                      "vllm.v1.sample.ops.topk_topp_sampler": tts}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    sys.modules["vllm.v1.sample.ops"].topk_topp_sampler = tts  # type: ignore[attr-defined]
    seen: list[dict[str, Any]] = []

    class Llm:
        def generate(self, prompts: list[Any], params: SamplingParams, use_tqdm: bool) -> list[Any]:
            seen.append(params.kw)
            outs = []
            for _ in prompts:
                tokens = [7, 8, 9]
                for _step in tokens:  # one sampler call a step when FlashInfer's path applies
                    if params.kw["temperature"] > 0 and "seed" not in params.kw:
                        sys.modules["vllm.v1.sample.ops.topk_topp_sampler"].flashinfer_sample()
                logprobs = ([{t: _Logprob(1 + i % 2)} for i, t in enumerate(tokens)] if params.kw.get("logprobs")
                            else None)
                outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=tokens,
                                                                                 logprobs=logprobs)]))
            return outs

    runs = _load("acceptance_runs")
    out = runs.phase_sampler(Llm())
    assert all("seed" not in kw for kw in seen) and [kw["temperature"] for kw in seen] == [0.0, 1.0, 1.0]
    assert out["flashinfer_sample_calls"] == {"greedy": 0, "top_k1": 72, "top_k5": 72}  # 24 requests x 3 steps
    assert out["seeded"] is False and out["equal"] is True
    assert out["top_k5_ranks"] == [[1, 2, 1]] * 24
    assert tts.flashinfer_sample is flashinfer_sample  # put back
