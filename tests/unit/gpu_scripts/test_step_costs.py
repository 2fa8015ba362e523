"""The step-cost script's CPU parts (tests/gpu/e2e/step_costs.py): its arguments, the engine it asks vLLM for, the
prompts, vLLM's histograms and the folding of runs into time per step, without vLLM."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .test_acceptance import E2E, _load


@pytest.fixture(scope="module")
def sc() -> ModuleType:
    return _load("step_costs")


@pytest.fixture(scope="module")
def meta() -> dict[str, Any]:
    info: dict[str, Any] = _load("real_size").meta()
    return info


def test_variants_parse_and_bad_ones_are_refused(sc: ModuleType) -> None:
    assert [sc.parse_variant(v) for v in sc.VARIANTS] == [
        ("target", 0), ("dflash", 3), ("dflash", 8), ("dflash", 15), ("mtp", 2), ("mtp", 4)]
    for bad in ("dflash", "dflash-0", "eagle-3", "mtp-100", "target-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected target, dflash-K or mtp-K"):
            sc.parse_variant(bad)


def test_concurrency_and_contexts_parse(sc: ModuleType) -> None:
    assert sc.parse_concurrency("22,1,8,8") == [1, 8, 22]
    assert sc.parse_contexts("short=512,long=16384") == {"short": 512, "long": 16384}
    for bad in ("0,8", "a", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="expected positive integers"):
            sc.parse_concurrency(bad)
    for bad in ("short", "short=0", "a=1,a=2", "=5"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME=TOKENS"):
            sc.parse_contexts(bad)


def test_cli_refuses_a_bad_variant_with_a_one_line_reason(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(E2E / "step_costs.py"), "run", "--variant", "eagle-3", "--models",
                           str(tmp_path), "--json", str(tmp_path / "x.json")], capture_output=True, text=True)
    assert proc.returncode == 2 and "variant 'eagle-3': expected target, dflash-K or mtp-K" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def _args(sc: ModuleType, *extra: str) -> argparse.Namespace:
    ns: argparse.Namespace = sc.build_parser().parse_args(
        ["run", "--models", "/m", "--json", "/o.json", *extra])
    return ns


def test_engine_kwargs_per_variant(sc: ModuleType, meta: dict[str, Any]) -> None:
    kw = sc.engine_kwargs(_args(sc, "--variant", "target"), meta)
    assert (kw["load_format"], kw["enable_prefix_caching"], kw["max_num_seqs"]) == ("dummy", False, 22)
    assert kw["max_model_len"] == 16384 + 64 + 0 + 16 and "speculative_config" not in kw
    assert kw["hf_overrides"] == {"text_config": {"global_head_dim": 512, "num_global_key_value_heads": 2}}
    assert "quantization" not in kw and kw["enforce_eager"] is False

    kw = sc.engine_kwargs(_args(sc, "--variant", "dflash-15", "--concurrency", "1,8"), meta)
    assert kw["speculative_config"] == {"method": "dflash", "model": "/m/dflash", "num_speculative_tokens": 15,
                                        "attention_backend": "flash_attn"}
    assert kw["max_num_batched_tokens"] == sc.STEP_TOKEN_BUDGET + 14 * 8

    kw = sc.engine_kwargs(_args(sc, "--variant", "mtp-2", "--mtp-folder", "mtp-standin", "--quantization",
                                "fp8", "--eager"), meta)
    assert kw["speculative_config"] == {"method": "mtp", "model": "/m/mtp-standin", "num_speculative_tokens": 2}
    assert (kw["quantization"], kw["enforce_eager"], kw["max_num_batched_tokens"]) == ("fp8", True,
                                                                                     sc.STEP_TOKEN_BUDGET)


def test_prompts_are_exact_length_deterministic_and_distinct(sc: ModuleType, meta: dict[str, Any]) -> None:
    batch = sc.prompts(meta, 8, 512)
    assert len(batch) == 8 and {len(p) for p in batch} == {512}
    assert all(p[0] == 2 and min(p[1:]) >= 16 and max(p) < 262_144 for p in batch)
    assert len({tuple(p) for p in batch}) == 8
    assert batch == sc.prompts(meta, 8, 512)  # every variant gets the same prompts


def test_histogram_delta_and_quantile(sc: ModuleType) -> None:
    before = {"count": 10, "sum": 0.5, "buckets": {"0.01": 4, "0.025": 9, "Inf": 10}}
    after = {"count": 110, "sum": 2.5, "buckets": {"0.01": 14, "0.025": 99, "Inf": 110}}
    d = sc.hist_delta(before, after)
    assert d == {"count": 100, "sum": 2.0, "buckets": {"0.01": 10, "0.025": 90, "Inf": 100}}
    assert sc.hist_quantile(d, 0.05) == 0.01 and sc.hist_quantile(d, 0.5) == 0.025
    assert sc.hist_quantile(d, 0.99) == float("inf")
    assert sc.hist_quantile({"count": 0, "sum": 0.0, "buckets": {}}, 0.5) is None


def _raw(conc: int, context: str, full_s: float, drafts: int | None = None, accepted: int = 0,
         drafter_s: float | None = None) -> dict[str, Any]:
    raw: dict[str, Any] = {"concurrency": conc, "context": context, "context_tokens": 512, "output_tokens": 64,
                           "prefill_s": 0.7, "full_s": full_s,
                           "itl": {"count": 63 * conc, "sum": (full_s - 0.7) * conc,
                                   "buckets": {"0.05": 0, "0.1": 63 * conc, "Inf": 63 * conc}}}
    if drafts is not None:
        raw["spec"] = {"num_drafts": drafts, "num_draft_tokens": drafts * 8, "num_accepted_tokens": accepted}
    if drafter_s is not None:
        raw["drafter_s"] = drafter_s
    return raw


def test_fold_cell_target_and_speculative(sc: ModuleType) -> None:
    t = sc.fold_cell("target", 0, _raw(8, "short", 7.0))
    assert t["steps_per_request"] == 63 and t["step_wall_s"] == pytest.approx(6.3 / 63)
    assert t["step_itl_s"] == pytest.approx(6.3 / 63) and t["step_itl_p50_s"] == 0.1
    s = sc.fold_cell("dflash", 8, _raw(8, "short", 9.52, drafts=63 * 8, drafter_s=1.26))
    assert s["steps_per_request"] == 63 and s["step_wall_s"] == pytest.approx(8.82 / 63)
    assert (s["tau"], s["all_rejected"]) == (1.0, True)
    assert s["draft_s"] == pytest.approx(0.02) and s["per_draft_s"] == pytest.approx(0.0025)
    assert s["verify_s"] == pytest.approx(8.82 / 63 - 0.02)
    # a trained drafter accepting: fewer steps for the same tokens
    a = sc.fold_cell("mtp", 4, _raw(1, "short", 2.8, drafts=21, accepted=42))
    assert (a["steps_per_request"], a["tau"], a["all_rejected"]) == (21, 3.0, False)
    with pytest.raises(ValueError, match="no drafts counted"):
        sc.fold_cell("dflash", 3, _raw(1, "short", 2.0, drafts=0))


def test_fold_relates_each_step_to_the_target_of_its_cell(sc: ModuleType, tmp_path: Path) -> None:
    runs = [
        {"variant": "dflash-8", "ok": True, "cells": [_raw(8, "short", 9.52, drafts=504)]},
        {"variant": "target", "ok": True, "cells": [_raw(8, "short", 7.0), _raw(1, "short", 4.48)]},
        {"variant": "mtp-4", "ok": False, "stage": "engine_start", "error": "ValueError: KV sharing", "cells": []},
    ]
    for i, run in enumerate(runs):
        (tmp_path / f"{i}.json").write_text(json.dumps(run))
    out = tmp_path / "folded.json"
    proc = subprocess.run([sys.executable, str(E2E / "step_costs.py"), "fold", *(str(tmp_path / f"{i}.json")
                                                                              for i in range(3)), "--json", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert [(c["method"], c["concurrency"]) for c in doc["cells"]] == [("target", 1), ("target", 8), ("dflash", 8)]
    dflash = doc["cells"][2]
    assert dflash["step_ratio_wall"] == pytest.approx((8.82 / 63) / (6.3 / 63))
    assert dflash["step_ratio_itl"] == pytest.approx(8.82 / 6.3)
    assert doc["failed"] == [{"variant": "mtp-4", "stage": "engine_start", "error": "ValueError: KV sharing"}]
    assert "tau near 1" in doc["note"]
    # no budget recorded with these runs: only the single-request cell's latency counts as a decode step
    assert [c["step_basis"] for c in doc["cells"]] == ["itl", "wall", "wall"]
    assert dflash["step_ratio"] == dflash["step_ratio_wall"]


def test_a_cells_step_is_the_latency_only_where_no_prompt_prefills_beside_a_decode(sc: ModuleType) -> None:
    assert sc.itl_is_clean(1, 16384, 8192)  # one request: its own prefill ends before it decodes
    assert sc.itl_is_clean(8, 512, 8192) and sc.itl_is_clean(16, 512, 8192)  # every prompt in one step
    assert not sc.itl_is_clean(22, 512, 8192) and not sc.itl_is_clean(8, 512, None)
    raw = _raw(8, "short", 7.0)
    raw["itl"]["sum"] = 63 * 8 * 0.09  # vLLM's latency and the wall disagree: the clean latency is the step
    clean = sc.fold_cell("target", 0, raw, 8192)
    assert (clean["step_basis"], clean["step_s"]) == ("itl", pytest.approx(0.09))
    assert clean["wall_over_itl"] == pytest.approx(0.1 / 0.09)
    busy = sc.fold_cell("target", 0, raw, 2048)  # 8 x 512 prompts over 2048-token steps: the wall
    assert (busy["step_basis"], busy["step_s"]) == ("wall", pytest.approx(0.1)) and "wall_over_itl" not in busy


def test_a_cell_whose_passes_contradict_each_other_is_unmeasured(sc: ModuleType) -> None:
    """The first real-size runs: 22 x 512 with the target alone, its prefill pass 1.909 s, its full pass 1.020 s."""
    raw = _raw(22, "short", 1.020)
    raw["prefill_s"] = 1.909
    cell = sc.fold_cell("target", 0, raw, 8192)
    assert cell["step_wall_s"] is None and cell["step_s"] is None and cell["step_basis"] is None
    assert "no slower than the fastest prefill pass (1.909 s)" in cell["unmeasured"]
    run = {"variant": "dflash-8", "ok": True, "engine_kwargs": {"max_num_batched_tokens": 8346},
           "cells": [_raw(22, "short", 1.5, drafts=63 * 22)]}
    doc = sc.fold([{"variant": "target", "ok": True, "cells": [raw]}, run])
    assert "step_ratio" not in doc["cells"][1] and doc["cells"][1]["step_s"] is not None


def test_repeated_passes_keep_the_fastest_and_count_steps_per_pass(sc: ModuleType) -> None:
    raw = _raw(8, "short", 9.52, drafts=2 * 63 * 8, drafter_s=2 * 1.26)
    raw.update(repeats=2, prefill_runs=[0.9, 0.7], full_runs=[9.52, 9.9])
    raw["itl"] = {"count": 2 * 63 * 8, "sum": 2 * 8.82 * 8, "buckets": {"0.1": 0, "0.2": 2 * 63 * 8}}
    cell = sc.fold_cell("dflash", 8, raw, 8192 + 7 * 8)
    assert cell["repeats"] == 2 and cell["steps_per_request"] == 63
    assert cell["step_wall_s"] == pytest.approx(8.82 / 63) and cell["step_itl_s"] == pytest.approx(8.82 / 63)
    assert cell["draft_s"] == pytest.approx(0.02) and cell["verify_s"] == pytest.approx(8.82 / 63 - 0.02)


def test_importable_and_help_without_vllm(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import step_costs; "
                           "print('vllm' in sys.modules, 'torch' in sys.modules)", str(E2E)],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.split() == ["False", "False"], proc.stderr
    proc = subprocess.run([sys.executable, str(E2E / "step_costs.py"), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "random-weights run can show" in proc.stdout


class _Metric:
    def __init__(self, name: str, **kw: Any) -> None:
        self.name = name
        self.__dict__.update(kw)


class _StandInLLM:
    """vLLM's LLM as measure() uses it: generate() advances a clock by a scripted time per call and emits the asked
    number of tokens; get_metrics() shows the latency histogram and the draft counters those calls added."""

    def __init__(self, durations: list[float], clock: list[float], drafter: dict[str, float] | None = None) -> None:
        self.durations, self.clock, self.calls = list(durations), clock, []  # type: list[int]
        self.itl_count = self.itl_sum = self.drafts = 0.0
        self.drafter = drafter  # the proposer's clock: 10 ms after every prefill step, 5 ms a decode step

    def generate(self, batch: list[Any], params: Any, use_tqdm: bool = False) -> list[Any]:
        n = params.max_tokens
        self.calls.append(n)
        spent = self.durations.pop(0)
        self.clock[0] += spent
        if self.drafter is not None:
            self.drafter["seconds"] += 0.010 + 0.005 * (n - 1)
        if n > 1:  # one latency observation and one draft per request per decode step
            self.itl_count += (n - 1) * len(batch)
            self.itl_sum += spent * len(batch)
            self.drafts += (n - 1) * len(batch)
        out = type("Out", (), {"token_ids": [0] * n})
        return [type("Req", (), {"outputs": [out]}) for _ in batch]

    def get_metrics(self) -> list[_Metric]:
        return [_Metric("vllm:inter_token_latency_seconds", count=self.itl_count, sum=self.itl_sum,
                        buckets={"0.1": self.itl_count, "Inf": self.itl_count}),
                _Metric("vllm:spec_decode_num_drafts", value=self.drafts),
                _Metric("vllm:spec_decode_num_draft_tokens", value=8 * self.drafts),
                _Metric("vllm:spec_decode_num_accepted_tokens", value=0)]


@pytest.fixture
def clock(sc: ModuleType, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """vLLM's two names measure() imports, as plain stand-ins, and the clock it reads (advanced by _StandInLLM)."""
    import types

    fake = types.ModuleType("vllm")
    fake.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)  # type: ignore[attr-defined]
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda **kw: kw  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    now = [0.0]
    monkeypatch.setattr(sc.time, "perf_counter", lambda: now[0])
    return now


def test_measure_repeats_the_passes_and_keeps_the_fastest(sc: ModuleType, meta: dict[str, Any],
                                                          clock: list[float]) -> None:
    """measure() against a stand-in shaped like vLLM's LLM: a warm-up, then prefill and full passes --repeats
    times; the slow second prefill pass (a hiccup) does not decide the cell."""
    llm = _StandInLLM([5.0, 0.2, 1.0, 0.9, 1.05], clock)  # warm-up, (prefill, full) x 2
    raw = sc.measure(llm, meta, 4, "short", 64, 17, True, None, repeats=2)
    assert llm.calls == [4, 1, 17, 1, 17]
    assert raw["prefill_runs"] == pytest.approx([0.2, 0.9]) and raw["full_runs"] == pytest.approx([1.0, 1.05])
    assert (raw["prefill_s"], raw["full_s"], raw["repeats"]) == (pytest.approx(0.2), pytest.approx(1.0), 2)
    assert raw["itl"]["count"] == 2 * 16 * 4  # the warm-up's latencies are not the cell's
    assert raw["spec"]["num_drafts"] == 2 * 16 * 4 and raw["emitted"] == [17] * 4
    assert raw["outputs_sha256"] == hashlib.sha256(json.dumps([[0] * 17] * 4).encode()).hexdigest()
    cell = sc.fold_cell("dflash", 8, raw, 8192)
    assert cell["steps_per_request"] == 16 and cell["step_wall_s"] == pytest.approx(0.8 / 16)


def test_the_drafters_time_is_the_decode_steps_alone(sc: ModuleType, meta: dict[str, Any],
                                                     clock: list[float]) -> None:
    """vLLM proposes after a prefill step as well (drafts that a one-token request never verifies): the prefill
    pass's drafting comes off the full pass's, so draft_s is the decode steps' drafting."""
    drafter = {"seconds": 0.0, "calls": 0, "depth": 0}
    llm = _StandInLLM([5.0, 0.2, 1.0, 0.2, 1.0], clock, drafter)
    raw = sc.measure(llm, meta, 1, "long", 64, 17, True, drafter, repeats=2)
    assert raw["drafter_prefill_s"] == pytest.approx(2 * 0.010)
    assert raw["drafter_s"] == pytest.approx(2 * 16 * 0.005)  # not the warm-up's, not the prefill steps'
    cell = sc.fold_cell("dflash", 8, raw, 8192)
    assert cell["draft_s"] == pytest.approx(0.005) and cell["per_draft_s"] == pytest.approx(0.005 / 8)
    assert cell["verify_s"] == pytest.approx(cell["step_s"] - 0.005)


def test_a_ratio_is_of_steps_measured_alike(sc: ModuleType) -> None:
    """20 x 420 tokens: the target's 8192-token steps cannot take every prompt at once (wall), a drafter run's
    budget asked for more but vLLM schedules the same 8192 (its draft slots come on top): both wall, one ratio."""
    target = {"variant": "target", "ok": True, "resolved": {"max_num_scheduled_tokens": 8192},
              "engine_kwargs": {"max_num_batched_tokens": 8192}, "cells": [_raw(20, "mid", 3.0)]}
    spec = {"variant": "dflash-15", "ok": True, "resolved": {"max_num_scheduled_tokens": 8192},
            "engine_kwargs": {"max_num_batched_tokens": 8192 + 14 * 20},
            "cells": [_raw(20, "mid", 3.5, drafts=63 * 20)]}
    for run in (target, spec):
        run["cells"][0]["context_tokens"] = 420
    doc = sc.fold([target, spec])
    assert [c["step_basis"] for c in doc["cells"]] == ["wall", "wall"]
    assert doc["cells"][1]["step_ratio"] == pytest.approx(2.8 / 2.3)
    # had the drafter run's asked-for budget decided, its latency would be divided by the target's wall
    spec.pop("resolved")
    mixed = sc.fold([target, spec])
    assert mixed["cells"][1]["step_basis"] == "itl" and "step_ratio" not in mixed["cells"][1]


def test_two_runs_of_one_variant_are_two_folds(sc: ModuleType) -> None:
    """A labelled chain runs dflash-8 with the released and the split attention: folded together, one would stand
    for the other's cells; the fold refuses and says to fold each way on its own."""
    run = {"variant": "dflash-8", "ok": True, "cells": [_raw(1, "short", 1.0, drafts=63)]}
    with pytest.raises(ValueError, match="two runs of dflash-8"):
        sc.fold([run, dict(run)])
