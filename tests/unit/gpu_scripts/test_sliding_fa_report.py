"""tests/gpu/e2e/sliding_fa_report.py and sliding_fa_runs.py's pure parts: tokens/s and FA / Triton ratios from the
runs' own timings, the greedy comparison judged against the dtype's tolerance (identical contexts within it, a
parting only at a near-tie), the engine's layers checked against the variant asked for, the fp16 runs judging, no
machine path in the written result; the workloads and engine settings both variants share."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

E2E = Path(__file__).resolve().parents[2] / "gpu" / "e2e"
BF16, FP16 = 0.25, 2 * 2.0**-6


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"e2e_{name}", E2E / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return _load("sliding_fa_report")


@pytest.fixture(scope="module")
def runs_script() -> ModuleType:
    sys.path.insert(0, str(E2E))  # the script imports engine_runs and jsonio from its own folder
    try:
        return _load("sliding_fa_runs")
    finally:
        sys.path.remove(str(E2E))


LAYERS = {
    "triton": [{"sliding_window": 128, "backend": "TRITON_ATTN"}, {"sliding_window": None, "backend": "TRITON_ATTN"}],
    "fa": [{"sliding_window": 128, "backend": "FLASH_ATTN"}, {"sliding_window": None, "backend": "TRITON_ATTN"}],
}


def _outputs(tokens: dict[str, list[int]], logprob: float = -1.0, gap: float = 1.0,
             at: dict[str, tuple[int, float, float]] | None = None) -> list[dict[str, Any]]:
    """Requests with a constant logprob and top-2 gap, except ``at[id] = (position, logprob, gap)``."""
    out = []
    for key, ids in tokens.items():
        lps, gaps = [logprob] * len(ids), [gap] * len(ids)
        if at and key in at:
            pos, lp, g = at[key]
            lps[pos], gaps[pos] = lp, g
        out.append({"id": key, "token_ids": ids, "logprob": lps, "top2_gap": gaps})
    return out


def _timing(prefill: list[float], total: list[float], prompt_tokens: int = 1000, requests: int = 4,
            output_tokens: int = 260) -> dict[str, Any]:
    return {"prefill_s": prefill, "total_s": total, "prompt_tokens": prompt_tokens, "requests": requests,
            "output_tokens": output_tokens}


def _write(runs: Path, variant: str, suffix: str = "", *, text: list[dict[str, Any]] | None = None,
           image: list[dict[str, Any]] | None = None, timing: dict[str, Any] | None = None,
           layers: list[dict[str, Any]] | None = None, **extra: Any) -> None:
    runs.mkdir(parents=True, exist_ok=True)
    doc = {"ok": True, "mode": "sliding-fa", "variant": variant, "log": f"/some/stage/runs/sliding-fa-{variant}.log",
           "layer_backends": LAYERS[variant] if layers is None else layers,
           "outputs": {"text": text if text is not None else _outputs({"t0": [1, 2, 3]}),
                       "image": image if image is not None else _outputs({"i0": [4, 5, 6]})},
           "timing": timing or {}, "flash_attn_version": 3 if variant == "fa" else None, **extra}
    (runs / f"sliding-fa-{variant}{suffix}.json").write_text(json.dumps(doc))


def test_speed_ratios_come_from_the_median_times(report: ModuleType, tmp_path: Path) -> None:
    # Triton: prefill 1000 tokens in 1.0 s (median of 3), decode 256 tokens in 2.0 s; FA: 0.5 s and 1.6 s.
    _write(tmp_path, "triton", timing={"text": _timing([1.0, 1.2, 0.9], [3.0, 3.5, 2.9]), "image": {}})
    _write(tmp_path, "fa", timing={"text": _timing([0.5, 0.4, 9.0], [2.1, 2.0, 2.2]), "image": {}})
    speed = report.build(tmp_path)["speed"]
    assert (speed["dtype"], speed["numerics"]) == ("bfloat16", "default")
    text = speed["text"]
    assert text["prefill_tokens_per_s"] == {"triton": 1000.0, "sliding_fa": 2000.0, "ratio": 2.0}
    assert text["decode_tokens_per_s"] == {"triton": 128.0, "sliding_fa": 160.0, "ratio": 1.25}
    # A workload without timings has no figures rather than made-up ones.
    assert speed["image"]["prefill_tokens_per_s"] == {"triton": None, "sliding_fa": None, "ratio": None}


def test_equal_greedy_outputs_are_within_tolerance(report: ModuleType, tmp_path: Path) -> None:
    _write(tmp_path, "triton")
    _write(tmp_path, "fa")
    doc = report.build(tmp_path)
    greedy = doc["greedy"]["bfloat16-default"]
    assert greedy["tolerance"] == BF16 and greedy["max_logprob_delta"] == 0.0
    assert greedy["text"]["equal_requests"] == 1 and greedy["image"]["within_tolerance"] is True
    assert doc["judged"] == "bfloat16-default" and doc["within_tolerance"] is True
    assert doc["layer_backends_as_asked"] == {"sliding-fa-triton": True, "sliding-fa-fa": True}


def test_logprobs_drifting_beyond_the_tolerance_fail(report: ModuleType, tmp_path: Path) -> None:
    tokens = {"i0": [4, 5, 6]}
    _write(tmp_path, "triton", image=_outputs(tokens, logprob=-1.0))
    _write(tmp_path, "fa", image=_outputs(tokens, logprob=-1.0 - 0.3))  # above bf16's 0.25
    greedy = report.build(tmp_path)["greedy"]["bfloat16-default"]
    assert greedy["image"]["max_logprob_delta"] == pytest.approx(0.3)
    assert greedy["image"]["within_tolerance"] is False and greedy["within_tolerance"] is False
    assert greedy["text"]["within_tolerance"] is True  # judged per workload too


@pytest.mark.parametrize(("gap", "expected"), [(0.4, True), (0.6, False)])
def test_a_parting_is_rounding_only_at_a_near_tie(report: ModuleType, tmp_path: Path, gap: float,
                                                   expected: bool) -> None:
    # The runs part at position 2; Triton's top two logprobs there are `gap` apart (2 x 0.25 = 0.5 allowed).
    _write(tmp_path, "triton", text=_outputs({"t0": [1, 2, 3, 4]}, at={"t0": (2, -0.7, gap)}))
    _write(tmp_path, "fa", text=_outputs({"t0": [1, 2, 9, 9]}))
    greedy = report.build(tmp_path)["greedy"]["bfloat16-default"]
    assert greedy["text"]["equal_requests"] == 0
    diff = greedy["text"]["differences"]["t0"]
    assert diff["first_difference"] == 2 and diff["reference_top2_gap_there"] == gap
    assert diff["compared_positions"] == 2  # only the identical contexts before the parting
    assert diff["difference_is_rounding"] is expected and greedy["within_tolerance"] is expected


def test_missing_or_truncated_requests_fail(report: ModuleType, tmp_path: Path) -> None:
    _write(tmp_path, "triton", text=_outputs({"t0": [1, 2, 3], "t1": [7, 8]}))
    _write(tmp_path, "fa", text=_outputs({"t0": [1, 2]}))
    greedy = report.build(tmp_path)["greedy"]["bfloat16-default"]
    assert greedy["text"]["missing_requests"] == ["t1"]
    assert greedy["text"]["differences"]["t0"]["first_difference"] == 2
    assert greedy["within_tolerance"] is False


def test_fp16_runs_judge_with_their_own_tolerance(report: ModuleType, tmp_path: Path) -> None:
    _write(tmp_path, "triton")
    _write(tmp_path, "fa")
    tokens = {"t0": [1, 2, 3]}
    _write(tmp_path, "triton", "-float16", text=_outputs(tokens, logprob=-1.0))
    _write(tmp_path, "fa", "-float16", text=_outputs(tokens, logprob=-1.05))  # fine in bf16, not in fp16
    doc = report.build(tmp_path)
    assert doc["judged"] == "float16-default"
    assert doc["greedy"]["float16-default"]["tolerance"] == FP16
    assert doc["greedy"]["float16-default"]["within_tolerance"] is False
    assert doc["greedy"]["bfloat16-default"]["within_tolerance"] is True
    assert doc["within_tolerance"] is False
    assert doc["speed"]["dtype"] == "bfloat16"  # speed stays with the bf16 default kernels


def test_a_fa_run_whose_sliding_layers_are_not_on_flash_attn_fails(report: ModuleType, tmp_path: Path) -> None:
    _write(tmp_path, "triton")
    _write(tmp_path, "fa", layers=LAYERS["triton"])  # e.g. a wheel without per-kind backends ignored the config
    doc = report.build(tmp_path)
    assert doc["greedy"]["bfloat16-default"]["within_tolerance"] is True
    assert doc["layer_backends_as_asked"]["sliding-fa-fa"] is False
    assert doc["within_tolerance"] is False


def test_failed_run_is_listed_and_judges_nothing(report: ModuleType, tmp_path: Path) -> None:
    _write(tmp_path, "triton")
    (tmp_path / "sliding-fa-fa.json").write_text(json.dumps({"ok": False, "error": "ValueError: backend_per_kind"}))
    doc = report.build(tmp_path)
    assert doc["runs"]["sliding-fa-fa"]["ok"] is False and doc["greedy"] == {}
    assert doc["judged"] is None and doc["within_tolerance"] is False and doc["speed"] is None


def test_written_result_holds_no_stage_path_and_needs_runs(report: ModuleType, tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "out"
    assert report.main(["--runs", str(runs), "--out", str(out)]) == 2
    _write(runs, "triton", backends=["Using cache directory: /some/stage/vllm-cache/x"])
    _write(runs, "fa")
    assert report.main(["--runs", str(runs), "--out", str(out), "--note", "one run"]) == 0
    text = (out / "vllm-0.21.0-sliding-fa.json").read_text()
    assert "/some/stage/" not in text
    doc = json.loads(text)
    assert doc["notes"] == ["one run"] and doc["flash_attn_version"] == 3


# --- sliding_fa_runs.py: what both variants share ---------------------------------------------------------
def test_workloads_are_deterministic_and_exercise_the_window_and_images(runs_script: ModuleType) -> None:
    meta = {"vocab_size": 1024, "first_word_id": 16, "special_ids": {"<bos>": 2}, "image_token": "<|image|>"}
    first, again = runs_script.build_workloads(meta), runs_script.build_workloads(meta)
    assert first == again
    text, image = first["text"], first["image"]
    assert len(text) == 32 and len(image) == 16
    assert min(len(r["token_ids"]) for r in text) > 128  # past the tiny model's sliding window
    assert all(r["text"].count("<|image|>") == 1 and "image" in r for r in image)
    assert max(len(r["text"].split(" <|image|> ")[0].split()) for r in image) > 128  # images deep in a window


def test_engine_settings_differ_only_in_the_attention_config(runs_script: ModuleType, tmp_path: Path) -> None:
    meta = {"target_hf_overrides": {"text_config": {"global_head_dim": 512}}}
    triton = runs_script.engine_kwargs("triton", tmp_path, meta, 0.3)
    fa = runs_script.engine_kwargs("fa", tmp_path, meta, 0.3)
    assert triton.pop("attention_config") == {}
    assert fa.pop("attention_config") == {"backend_per_kind": {"sliding_window": "FLASH_ATTN"}}
    assert triton == fa
    assert fa["enable_prefix_caching"] is False and "speculative_config" not in fa


def test_greedy_record_keeps_each_tokens_logprob_and_gap(runs_script: ModuleType) -> None:
    lp = SimpleNamespace
    output = SimpleNamespace(prompt_token_ids=[2, 3, 4], outputs=[SimpleNamespace(
        token_ids=[7, 9],
        logprobs=[{7: lp(logprob=-0.1), 8: lp(logprob=-2.6)}, {9: lp(logprob=-0.7), 5: lp(logprob=-0.7)}])])
    record = runs_script.greedy_record({"id": "t0", "token_ids": [2, 3, 4]}, output)
    assert record == {"id": "t0", "image": False, "prompt_len": 3, "token_ids": [7, 9], "logprob": [-0.1, -0.7],
                      "top2_gap": [2.5, 0.0]}


class _FakeLLM:
    """Stands in for vLLM's engine, which needs a GPU: every request gets ``max_tokens`` tokens with logprobs."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def generate(self, prompts: list[Any], params: list[Any], use_tqdm: bool = False) -> list[Any]:
        self.calls.append((len(prompts), params[0].max_tokens))
        time.sleep(0.001 * params[0].max_tokens)  # a pass takes longer the more tokens it makes
        lp = SimpleNamespace
        outs = []
        for i, prompt in enumerate(prompts):
            ids = list(range(10 + i, 10 + i + params[0].max_tokens))
            logprobs = [{t: lp(logprob=-0.5), 3: lp(logprob=-1.5)} for t in ids] if params[0].logprobs else None
            prompt_ids = prompt.get("prompt_token_ids") or [0] * 90  # an image prompt: text + soft tokens
            outs.append(SimpleNamespace(prompt_token_ids=prompt_ids,
                                        outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs)]))
        return outs


def test_measured_timings_are_what_the_report_reads(runs_script: ModuleType, report: ModuleType,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=SimpleNamespace))
    meta = {"vocab_size": 1024, "first_word_id": 16, "special_ids": {"<bos>": 2}, "image_token": "<|image|>"}
    reqs = runs_script.build_workloads(meta)["text"][:3]
    llm = _FakeLLM()
    timing, outputs = runs_script.measure(llm, reqs)
    reps = runs_script.REPS
    # warm-up, then (prefill, full) per repetition, then the greedy pass with logprobs
    assert llm.calls == [(3, 2), *[(3, 1), (3, runs_script.MAX_TOKENS)] * reps, (3, runs_script.MAX_TOKENS)]
    assert timing["prompt_tokens"] == sum(len(r["token_ids"]) for r in reqs)
    assert timing["output_tokens"] == 3 * runs_script.MAX_TOKENS and timing["requests"] == 3
    assert len(timing["prefill_s"]) == len(timing["total_s"]) == reps
    figures = report.rates(timing)
    assert figures["prefill_tokens_per_s"] is not None and figures["prefill_tokens_per_s"] > 0
    assert figures["decode_tokens_per_s"] is not None and figures["decode_tokens_per_s"] > 0
    assert [o["id"] for o in outputs] == [r["id"] for r in reqs]
    assert outputs[0]["logprob"] == [-0.5] * runs_script.MAX_TOKENS and outputs[0]["top2_gap"][0] == 1.0


# --- pairs: a forced FlashAttention version and repetitions ----------------------------------------------
def _pair(runs: Path, suffix: str, triton_s: float, fa_s: float, fa_version: int = 3, **extra: Any) -> None:
    """A pair whose text prefill takes triton_s / fa_s (median), 1000 prompt tokens; decode 256 tokens in 2 s."""
    _write(runs, "triton", suffix, timing={"text": _timing([triton_s] * 3, [triton_s + 2] * 3)}, **extra)
    _write(runs, "fa", suffix, timing={"text": _timing([fa_s] * 3, [fa_s + 2] * 3)}, flash_attn_version=fa_version,
           **extra)


def test_every_pair_is_read_and_the_ratios_spread_is_kept(report: ModuleType, tmp_path: Path) -> None:
    _pair(tmp_path, "", 1.0, 0.5)            # FA3 (vLLM's choice on sm_90): 2.0
    _pair(tmp_path, "-r2", 1.0, 1.25)        # its repetition: 0.8
    _pair(tmp_path, "-fa2", 0.8, 1.0, 2)     # FA2 forced: 0.8
    _pair(tmp_path, "-fa2-r2", 1.0, 1.0, 2)  # 1.0
    (tmp_path / "sliding-fa-fa-float32.json").write_text("{}")  # not a name run_e2e.sh gives: left out
    doc = report.build(tmp_path)
    assert list(doc["speed_pairs"]) == ["bfloat16-default", "bfloat16-default-r2", "bfloat16-default-fa2",
                                        "bfloat16-default-fa2-r2"]
    assert doc["speed"]["pair"] == "bfloat16-default" and doc["speed"]["flash_attn_version"] == 3
    assert doc["speed"]["text"]["prefill_tokens_per_s"]["ratio"] == 2.0
    spread = doc["speed_spread"]
    assert spread["all"]["text"]["prefill_tokens_per_s"] == {"min": 0.8, "median": 0.9, "max": 2.0, "pairs": 4}
    assert spread["fa3"]["text"]["prefill_tokens_per_s"] == {"min": 0.8, "median": 1.4, "max": 2.0, "pairs": 2}
    assert spread["fa2"]["text"]["prefill_tokens_per_s"]["pairs"] == 2
    assert spread["all"]["image"]["prefill_tokens_per_s"] is None  # no image timings: no figure
    # Triton alone moved by 1.25x between pairs (1000 vs 1250 tokens/s): the noise a ratio must exceed
    assert doc["triton_spread"]["bfloat16"]["text"]["prefill_tokens_per_s"] == 1.25
    assert doc["flash_attn_version"] == [2, 3]
    assert set(doc["greedy"]) == set(doc["speed_pairs"]) and doc["within_tolerance"] is True


def test_every_pair_of_the_judging_class_must_pass(report: ModuleType, tmp_path: Path) -> None:
    tokens = {"t0": [1, 2, 3]}
    for suffix, fa_lp in (("-float16", -1.0), ("-float16-fa2", -1.05)):  # FA2's fp16 pair drifts past 0.03125
        _write(tmp_path, "triton", suffix, text=_outputs(tokens, logprob=-1.0))
        _write(tmp_path, "fa", suffix, text=_outputs(tokens, logprob=fa_lp))
    _pair(tmp_path, "", 1.0, 1.0)
    doc = report.build(tmp_path)
    assert doc["judged"] == "float16-default"
    assert doc["judged_pairs"] == ["float16-default", "float16-default-fa2"]
    assert doc["greedy"]["float16-default"]["within_tolerance"] is True
    assert doc["greedy"]["float16-default-fa2"]["within_tolerance"] is False
    assert doc["within_tolerance"] is False


def test_run_e2e_names_a_pair_as_the_report_reads_it(report: ModuleType, tmp_path: Path) -> None:
    script = E2E / "run_e2e.sh"
    env = {"PATH": "/usr/bin:/bin", "G4E2E_STAGE": str(tmp_path / "stage"), "G4E2E_DTYPE": "float16",
           "G4E2E_FA_VERSION": "2", "G4E2E_REPEAT": "3"}
    proc = subprocess.run(["bash", str(script), "sliding-fa"], env=env, capture_output=True, text=True, timeout=60)
    # no overlaid wheel in this stage: each run says so, by the name it would have written
    assert "step sliding-fa-triton-float16-fa2-r3: overlaid wheel not installed" in proc.stdout
    assert "step sliding-fa-fa-float16-fa2-r3: overlaid wheel not installed" in proc.stdout
    pair = report.parse_suffix("-float16-fa2-r3")
    assert (pair.dtype, pair.numerics, pair.fa, pair.repeat) == ("float16", "default", 2, 3)
    for bad in ({"G4E2E_FA_VERSION": "4"}, {"G4E2E_REPEAT": "0"}, {"G4E2E_REPEAT": "x"}):
        proc = subprocess.run(["bash", str(script), "sliding-fa"], env={**env, **bad}, capture_output=True,
                              text=True, timeout=60)
        assert "expected" in proc.stderr and "not installed" not in proc.stdout
