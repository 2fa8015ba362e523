"""tests/device/flashinfer_result.py served: vLLM serving on FlashInfer's sampler from the jit-cache, read from the
two runs the device brought back (tests/device/results/flashinfer-served/, the runs as they came, session paths
as $G4S). The recorded result is what the fold makes of them: FlashInfer sampled the requests from the jit-cache with
nothing compiled. The first runs (seeded/) did not show it (their requests carried a seed, which vLLM 0.21.0 samples
natively), and their fold says so. Each way a run can fail to show the point turns its own check false."""

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
KEYS = ("vllms_sampler", "flashinfer_sampler", "compiled_during_flashinfer_run", "equal_to_vllms_sampler", "checks",
        "undecided", "undecided_why", "finding")


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flashinfer_result", DEVICE / "flashinfer_result.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _runs(where: Path = RUNS) -> tuple[dict[str, Any], dict[str, Any]]:
    return (json.loads((where / "target-sampler.json").read_text(encoding="utf-8")),
            json.loads((where / "target-sampler-fi.json").read_text(encoding="utf-8")))


def _wheel(tmp_path: Path) -> Path:
    wheel = tmp_path / "flashinfer_jit_cache-0.6.8.post1+g4jit.576efc38e072-cp39-abi3-linux_x86_64.whl"
    wheel.write_bytes(b"stand-in bytes")
    return wheel


def test_the_recorded_section_is_the_fold_of_the_recorded_runs(tmp_path: Path) -> None:
    section, ok = _module().served(*_runs(), [], _wheel(tmp_path))
    recorded = json.loads(RESULT.read_text(encoding="utf-8"))
    for key in KEYS:
        assert section[key] == recorded["served"][key], key
    assert section["jit_cache"]["file"] == recorded["served"]["jit_cache"]["file"]
    fi, plain = recorded["served"]["flashinfer_sampler"], recorded["served"]["vllms_sampler"]
    assert fi["tokens"] == plain["tokens"] == 768  # 24 requests x 32 tokens, each run
    # FlashInfer sampled the top_k=1 and top_k=5 requests, from the jit-cache, with nothing compiled
    assert fi["flashinfer_sample_calls"]["top_k1"] > 0 and fi["flashinfer_sample_calls"]["top_k5"] > 0
    assert not any(plain["flashinfer_sample_calls"].values()) and fi["seeded"] is False
    assert ok and recorded["checks"]["served_sampler_from_aot_no_compile"] is True
    # these runs recorded ranks alone; a rank 6 is read as a tie (vLLM's own sampler drew one too): undecided
    assert [k for k, v in section["checks"].items() if v is not True] == ["top_k5_draws_in_the_top_5"]
    assert section["checks"]["top_k5_draws_in_the_top_5"] is None and section["undecided"] == [
        "top_k5_draws_in_the_top_5"]
    assert fi["top_k5"]["worst_rank"] == plain["top_k5"]["worst_rank"] == 6
    assert "rank 6 in the same run" in section["undecided_why"]["top_k5_draws_in_the_top_5"]
    assert section["finding"] is None


def test_the_seeded_first_runs_fold_to_their_finding(tmp_path: Path) -> None:
    section, ok = _module().served(*_runs(RUNS / "seeded"), [], _wheel(tmp_path))
    recorded = json.loads(RESULT.read_text(encoding="utf-8"))["served_seeded"]
    for key in KEYS:
        assert section[key] == recorded[key], key
    # the library was mapped and the tokens agree, yet FlashInfer sampled none of the requests: not shown
    assert not ok and [k for k, v in section["checks"].items() if not v] == [
        "flashinfer_sampled_the_requests", "top_k5_not_all_argmax", "top_k5_draws_in_the_top_5"]
    assert "carried a seed" in section["finding"] and "seeded/" in recorded["superseded"]


def _counted(plain: dict[str, Any], fi: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded runs as phase_sampler now writes them: each top_k=5 draw's rank and its logprob less the fifth
    largest (a margin >= 0: in the top 5, ties included)."""
    plain, fi = copy.deepcopy(plain), copy.deepcopy(fi)
    draws = [[1] * 30 + [2, 4] for _ in range(24)]  # ranks of 32 top_k=5 draws a request
    margins = [[3.0] * 30 + [1.0, 0.25] for _ in range(24)]
    for run in (plain, fi):
        run["sampler"].update(top_k5_ranks=draws, top_k5_margins=margins)
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
    ("fi", lambda r: _spoil(r, "sampler.top_k5_ranks", [[1] * 32 for _ in range(24)]), "top_k5_not_all_argmax"),
    ("fi", lambda r: _spoil(r, "sampler.top_k5_margins", [[3.0] * 31 + [-0.5] for _ in range(24)]),
     "top_k5_draws_in_the_top_5"),
    ("fi", lambda r: _spoil(r, "sampler.top_k5_margins", [[3.0] * 31 + [None] for _ in range(24)]),
     "top_k5_draws_in_the_top_5"),
    ("fi", lambda r: _spoil(r, "sampler.top_k5_margins", [[3.0] * 31 for _ in range(24)]),
     "top_k5_draws_in_the_top_5"),
    ("fi", lambda r: _spoil(r, "sampler.top_k5_ranks", [[1] * 30 + [2, None] for _ in range(24)]),
     "top_k5_draws_in_the_top_5"),
])
def test_each_way_to_miss_the_point_fails_its_check(tmp_path: Path, which: str, spoil: Any, check: str) -> None:
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"x")
    plain, fi = _counted(*_runs())
    section, ok = _module().served(plain, fi, [], wheel)
    assert ok and all(v is True for v in section["checks"].values())  # the runs with margins pass, decided
    if which == "fi":
        fi = spoil(fi)
    else:
        plain = spoil(plain)
    section, ok = _module().served(plain, fi, [], wheel)
    assert not ok and section["checks"][check] is False
    assert [k for k, v in section["checks"].items() if not v] == [check]


def test_a_rank_over_5_is_a_tie_with_margins_and_undecided_without(tmp_path: Path) -> None:
    """vLLM's rank counts every token at least as likely, so a draw tied with the fifth reads as rank 6: with its
    margin 0 it is in the top 5; with ranks alone it is undecided, which neither passes nor fails the section; no
    draws at all fail both top_k=5 checks."""
    plain, fi = _counted(*_runs())
    tie = _spoil(_spoil(fi, "sampler.top_k5_ranks", [[1] * 31 + [6] for _ in range(24)]),
                 "sampler.top_k5_margins", [[3.0] * 31 + [0.0] for _ in range(24)])
    section, ok = _module().served(plain, tie, [], _wheel(tmp_path))
    assert ok and section["checks"]["top_k5_draws_in_the_top_5"] is True and not section["undecided"]
    assert section["flashinfer_sampler"]["top_k5"]["rank_over_5_tied_with_fifth"] == 24
    bare = copy.deepcopy(tie)
    del bare["sampler"]["top_k5_margins"]
    section, ok = _module().served(plain, bare, [], _wheel(tmp_path))
    # ranks alone, and vLLM's own sampler drew no rank over 5 in that run: the 6 is not explained by a tie
    assert not ok and section["checks"]["top_k5_draws_in_the_top_5"] is False
    # with ranks alone, a rank worse than vLLM's own sampler drew in the same run is no tie: a draw outside
    bare_plain = copy.deepcopy(plain)
    del bare_plain["sampler"]["top_k5_margins"]
    bare_plain["sampler"]["top_k5_ranks"] = [[1] * 31 + [6] for _ in range(24)]
    section, ok = _module().served(bare_plain, bare, [], _wheel(tmp_path))
    assert ok and section["checks"]["top_k5_draws_in_the_top_5"] is None
    assert "whether they stay in the top 5 is undecided" in section["cannot_show"]
    far = _spoil(bare, "sampler.top_k5_ranks", [[1] * 31 + [40] for _ in range(24)])
    section, ok = _module().served(bare_plain, far, [], _wheel(tmp_path))
    assert not ok and section["checks"]["top_k5_draws_in_the_top_5"] is False
    section, ok = _module().served(plain, _spoil(bare, "sampler.top_k5_ranks", [[1] * 30 + [2, 5]] * 24), [],
                                   _wheel(tmp_path))
    assert ok and section["checks"]["top_k5_draws_in_the_top_5"] is True  # every rank 5 or better decides
    section, ok = _module().served(plain, _spoil(fi, "sampler.top_k5_ranks", []), [], _wheel(tmp_path))
    assert not ok and [k for k, v in section["checks"].items() if not v] == ["top_k5_not_all_argmax",
                                                                             "top_k5_draws_in_the_top_5"]


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
    def __init__(self, rank: int, logprob: float) -> None:
        self.rank, self.logprob = rank, logprob


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
                tokens = [100, 8, 9]
                for _step in tokens:  # one sampler call a step when FlashInfer's path applies
                    if params.kw["temperature"] > 0 and "seed" not in params.kw:
                        sys.modules["vllm.v1.sample.ops.topk_topp_sampler"].flashinfer_sample()
                # vLLM returns the top 5 and the drawn token: the argmax, a draw tied with the fifth (which vLLM
                # ranks 6), a draw outside the top 5
                top = {100 + j: _Logprob(j + 1, -float(j)) for j in range(5)}
                logprobs = ([top, {**top, 8: _Logprob(6, -4.0)},
                             {**top, 9: _Logprob(7, -4.5)}] if params.kw.get("logprobs") else None)
                outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=tokens,
                                                                                 logprobs=logprobs)]))
            return outs

    runs = _load("acceptance_runs")
    out = runs.phase_sampler(Llm())
    assert all("seed" not in kw for kw in seen) and [kw["temperature"] for kw in seen] == [0.0, 1.0, 1.0]
    assert out["flashinfer_sample_calls"] == {"greedy": 0, "top_k1": 72, "top_k5": 72}  # 24 requests x 3 steps
    assert out["seeded"] is False and out["equal"] is True
    assert out["top_k5_ranks"] == [[1, 6, 7]] * 24
    assert out["top_k5_margins"] == [[4.0, 0.0, -0.5]] * 24
    assert tts.flashinfer_sample is flashinfer_sample  # put back
