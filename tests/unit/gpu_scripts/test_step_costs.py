"""The step-cost script's CPU parts (tests/gpu/e2e/step_costs.py): its arguments, the engine it asks vLLM for, the
prompts, vLLM's histograms and the folding of runs into time per step, without vLLM."""

from __future__ import annotations

import argparse
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
    assert "tau = 1" in doc["note"]


def test_importable_and_help_without_vllm(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import step_costs; "
                           "print('vllm' in sys.modules, 'torch' in sys.modules)", str(E2E)],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.split() == ["False", "False"], proc.stderr
    proc = subprocess.run([sys.executable, str(E2E / "step_costs.py"), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "random-weights run can show" in proc.stdout
