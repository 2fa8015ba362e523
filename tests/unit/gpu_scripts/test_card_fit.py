"""card_fit.py (a recipe's launch script in a card's share of a bigger GPU) and vllm_log.py (what vLLM reported).

Log lines come from two places, named at each test: real vLLM 0.21.0 output kept in
tests/gpu/results/vllm-0.21.0-e2e.json (an H100 run), and lines written from vLLM v0.21.0's format strings
(vllm_log.py's docstring names the files) where no recorded run printed them. The run itself goes through the real
`g4build recipe render` and the real bash script it writes; only `vllm` (fake_vllm_card.py) and `nvidia-smi`
stand in, since no GPU exists here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from tests.support.yamltext import yaml_text

from .test_acceptance import _load

ROOT = Path(__file__).resolve().parents[3]
E2E_RESULTS = ROOT / "tests" / "gpu" / "results" / "vllm-0.21.0-e2e.json"
FAKE = Path(__file__).with_name("fake_vllm_card.py")
GIB = 1 << 30
PREFIX = "(EngineCore pid=1007) INFO 11-23 19:05:57 "


@pytest.fixture(scope="module")
def log() -> ModuleType:
    return _load("vllm_log")


@pytest.fixture(scope="module")
def fit() -> ModuleType:
    return _load("card_fit")


def _recorded_lines() -> list[str]:
    out: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, str):
            out.extend(x.splitlines())

    walk(json.loads(E2E_RESULTS.read_text()))
    return out


def test_real_recorded_lines_parse(log: ModuleType) -> None:
    """Lines vLLM 0.21.0 printed on the H100 (the e2e results): the CUDA graph figures and a start failure."""
    lines = _recorded_lines()
    graph = [ln for ln in lines if "Estimated CUDA graph memory" in ln or "CUDA graph pool memory" in ln
             or "Graph capturing finished" in ln]
    assert len({ln.split("] ", 1)[1] for ln in graph}) >= 3
    got = log.parse("\n".join(graph[:3]))
    assert got["graph_estimate_gib"] == 0.04
    assert got["graph_pool_gib"] == 0.01
    assert got["graph_capture_gib"] == 0.01
    assert got["error_kind"] is None
    failed = next(ln for ln in lines if "[core.py:1140] ValueError: Selected backend" in ln)
    bad = log.parse(failed)
    assert bad["error_kind"] == "other"
    assert bad["error"].startswith("ValueError: Selected backend AttentionBackendEnum.FLASH_ATTN is not valid")
    assert bad["weights_gib"] is None


def test_started_lines_from_the_format_strings(log: ModuleType) -> None:
    text = "\n".join([
        PREFIX + "[gpu_model_runner.py:4960] Model loading took 48.37 GiB memory and 31.402113 seconds",
        PREFIX + "[gpu_model_runner.py:6145] Estimated CUDA graph memory: 1.25 GiB total",
        PREFIX.replace("INFO", "DEBUG") + "[gpu_worker.py:461] Memory profiling takes 41.07 seconds. Total non KV "
        "cache memory: 55.91GiB; torch peak memory increase: 5.83GiB; non-torch forward increase memory: 0.71GiB; "
        "weights memory: 49.33GiB.",
        PREFIX + "[gpu_worker.py:463] Available KV cache memory: 23.5 GiB",
        PREFIX + "[kv_cache_utils.py:1710] GPU KV cache size: 1,234,567 tokens",
        PREFIX + "[kv_cache_utils.py:1712] Maximum concurrency for 131,072 tokens per request: 9.42x",
    ])
    got = log.parse(text)
    assert (got["weights_gib"], got["load_s"]) == (48.37, 31.402113)
    assert got["available_kv_gib"] == 23.5
    assert got["kv_tokens"] == 1_234_567
    assert (got["concurrency_context"], got["max_concurrency"]) == (131_072, 9.42)
    assert got["graph_estimate_gib"] == 1.25
    assert (got["non_kv_gib"], got["torch_peak_increase_gib"], got["non_torch_increase_gib"]) == (55.91, 5.83, 0.71)
    assert got["error_kind"] is None and got["error"] is None


@pytest.mark.parametrize(("line", "kind", "estimate", "needed"), [
    ("ValueError: To serve at least one request with the models's max seq len (131072), (28.13 GiB KV cache is "
     "needed, which is larger than the available KV cache memory (3.2 GiB). Based on the available memory, the "
     "estimated maximum model length is 14848. Try increasing `gpu_memory_utilization` or decreasing "
     "`max_model_len` when initializing the engine.", "kv_too_small", 14848, 28.13),
    ("ValueError: To serve at least one request with the models's max seq len (131072), (28.13 GiB KV cache is "
     "needed, which is larger than the available KV cache memory (0.01 GiB). Try increasing "
     "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.", "kv_too_small", None,
     28.13),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
     "initializing the engine.", "no_kv_memory", None, None),
    ("ERROR [gpu_model_runner.py:4957] Failed to load model - not enough GPU memory. Try lowering "
     "--gpu-memory-utilization ... (original error: CUDA out of memory. Tried to allocate 2.00 GiB.)",
     "load_oom", None, None),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
     "139.81 GiB of which 1.02 GiB is free.", "oom", None, None),
])
def test_failures_from_the_format_strings(log: ModuleType, line: str, kind: str, estimate: int | None,
                                          needed: float | None) -> None:
    text = "\n".join(["(EngineCore pid=9) ERROR 11-29 01:00:01 [core.py:1140] EngineCore failed to start.",
                      "Traceback (most recent call last):", "(EngineCore pid=9) " + line,
                      "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"])
    got = log.parse(text)
    assert got["error_kind"] == kind
    assert got["estimated_max_model_len"] == estimate
    assert got["kv_needed_gib"] == needed
    assert "(EngineCore" not in got["error"]


def test_engine_failed_without_a_cause(log: ModuleType) -> None:
    got = log.failure("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    assert got["error_kind"] == "other" and "no cause" in got["error"]


def test_util_scaling(fit: ModuleType) -> None:
    h200 = int(139.8 * GIB)
    util = fit.scaled_util(0.8, 24, h200)
    assert util == 0.1373  # 19.2 / 139.8 = 0.13734: rounded down
    assert util * h200 <= 0.8 * 24 * GIB < (util + 0.0001) * h200
    assert fit.scaled_util(0.8, 32, h200) == 0.1831
    assert fit.scaled_util(0.8, 96, h200) == 0.5493
    assert fit.scaled_util(0.8, 24, h200, extra_gib=10.0) == 0.2088
    with pytest.raises(ValueError, match="not a share"):
        fit.scaled_util(0.8, 200, h200)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        fit.scaled_util(0.0, 24, h200)


def test_step_down_order(fit: ModuleType) -> None:
    no_estimate = {"error_kind": "kv_too_small", "estimated_max_model_len": None}
    assert fit.next_step(131072, 22, no_estimate, 4096) == (65536, 22)
    # vLLM's estimate skips the halvings it already rules out
    assert fit.next_step(131072, 22, {"error_kind": "kv_too_small", "estimated_max_model_len": 20000},
                         4096) == (16384, 22)
    assert fit.next_step(131072, 22, {"error_kind": "kv_too_small", "estimated_max_model_len": 100},
                         4096) == (4096, 22)
    # at the floor, max-num-seqs halves
    assert fit.next_step(4096, 22, no_estimate, 4096) == (4096, 11)
    assert fit.next_step(4096, 1, no_estimate, 4096) is None
    # no KV memory at all: the context cannot help
    assert fit.next_step(131072, 22, {"error_kind": "no_kv_memory"}, 4096) == (131072, 11)
    seen: list[tuple[int, int]] = []

    def attempt(c: int, s: int) -> dict[str, Any]:
        seen.append((c, s))
        return {"started": c <= 8192 and s <= 5, "vllm": no_estimate}

    tries = fit.search(32768, 22, attempt, min_context=8192, time_left=lambda: True)
    assert seen == [(32768, 22), (16384, 22), (8192, 22), (8192, 11), (8192, 5)]
    assert tries[-1]["started"]
    seen.clear()
    fit.search(32768, 22, attempt, min_context=8192, time_left=lambda: False)
    assert seen == [(32768, 22)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real")
    _load("real_size").write_all(out)
    return out


def _without_cards(tmp: Path) -> str:
    """The DFlash recipe as written before its cards table: these runs' arithmetic is the 32 GB settings' on each
    card (the table's row for 24 GB is test_a_card_with_a_row_runs_the_row's)."""
    data = yaml.safe_load((ROOT / "recipes" / "gemma4-26b-a4b-nvfp4-dflash.yaml").read_text(encoding="utf-8"))
    data.pop("cards")
    path = tmp / "gemma4-26b-a4b-nvfp4-dflash.yaml"
    path.write_text(yaml_text(data, sort_keys=False), encoding="utf-8")
    return str(path)


def _run(fit: ModuleType, tmp: Path, models: Path, card: int, monkeypatch: pytest.MonkeyPatch,
         *extra: str, weights_gib: float = 12.0, recipe: str | None = None) -> tuple[int, dict[str, Any],
                                                                                   list[list[str]]]:
    bindir = tmp / "fakebin"
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text('#!/usr/bin/env bash\n[[ "$*" == *query-gpu* ]] && echo 9.0 || echo "GPU 0: NVIDIA H200"\n')
    smi.chmod(0o755)
    calls = tmp / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    monkeypatch.setenv("FAKE_TOTAL_GIB", "140")
    monkeypatch.setenv("FAKE_WEIGHTS_GIB", f"{weights_gib:.4f}")
    monkeypatch.setenv("FAKE_KV_BYTES_PER_TOKEN", str(225_280))  # size_model's bytes per token in the window
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "toolkit"))
    out = tmp / f"card-{card}.json"
    rc = fit.main(["run", "--recipe", recipe or _without_cards(tmp), "--card-gib", str(card), "--models",
                   str(models), "--json", str(out), "--total-bytes", str(140 * GIB), "--port", str(_free_port()),
                   "--vllm-command", f"{sys.executable} {FAKE}", "--limit", "240", *extra])
    argvs = [json.loads(ln) for ln in calls.read_text().splitlines()] if calls.exists() else []
    calls.unlink(missing_ok=True)
    return rc, json.loads(out.read_text()), argvs


def test_run_steps_down_through_the_rendered_script_and_folds(fit: ModuleType, models: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # 24 GiB card: 0.8 x 24 = 19.2 GiB budget, 12 GiB weights, 2.1 GiB activations at 22 seqs: ~5 GiB of KV,
    # 24,279 tokens; vLLM's estimate sends the shipped 65536 straight to 16384
    rc, res, argvs = _run(fit, tmp_path, models, 24, monkeypatch)
    assert rc == 0
    assert res["util"] == 0.1371 and res["budget_gib"] == 19.19
    assert [(a["context"], a["max_num_seqs"], a["started"]) for a in res["attempts"]] == [
        (65536, 22, False), (16384, 22, True)]
    first = res["attempts"][0]["vllm"]
    assert first["error_kind"] == "kv_too_small" and first["estimated_max_model_len"] == 24279
    assert first["weights_gib"] == 12.0
    argv = argvs[0]
    assert argv[0] == "serve" and argv[1] == str(models / "target")
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.1371"
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert json.loads(argv[argv.index("--hf-overrides") + 1])["text_config"]["global_head_dim"] == 512
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["model"] == str(models / "dflash") and spec["num_speculative_tokens"] == 15
    assert [a[a.index("--max-model-len") + 1] for a in argvs] == ["65536", "16384"]
    summary = res["summary"]
    assert summary["started_at_shipped"] is False and summary["fits"] == {"context": 16384, "max_num_seqs": 22}
    assert summary["vllm_estimated_max_model_len"] == 24279
    assert summary["at"]["kv_tokens"] == 24279 and summary["at"]["max_concurrency"] == 1.48
    assert summary["at"]["overhead_gib"] == pytest.approx(2.1, abs=0.02)
    # the profile's parts (vLLM logs them at DEBUG, which the run turns on) and the prefill chunk it ran with
    assert summary["at"]["torch_peak_increase_gib"] == pytest.approx(1.85, abs=0.01)
    assert summary["at"]["non_torch_increase_gib"] == 0.25 and summary["at"]["max_num_batched_tokens"] == 8192
    assert [a["max_num_batched_tokens"] for a in res["attempts"]] == [8192, 8192]
    assert summary["full_context_sequences_fit"] is False
    assert summary["at"]["kv_gib_per_sequence"] == pytest.approx(16384 * 225_280 / GIB, abs=0.01)
    # 96 GiB card: the shipped settings start
    rc96, res96, _ = _run(fit, tmp_path, models, 96, monkeypatch)
    assert rc96 == 0 and res96["summary"]["started_at_shipped"] is True
    assert len(res96["attempts"]) == 1
    assert fit.main(["fold", str(tmp_path / "card-24.json"), str(tmp_path / "card-96.json"), "--json",
                     str(tmp_path / "fold.json")]) == 0
    folded = json.loads((tmp_path / "fold.json").read_text())
    assert folded["runs"] == ["card-24.json", "card-96.json"]
    row = folded["table"]["gemma4-26b-a4b-nvfp4-dflash"]
    assert set(row) == {"24", "96"}
    assert row["24"]["fits"]["context"] == 16384 and row["96"]["started_at_shipped"] is True


def test_run_with_nothing_fitting_stops_at_one_sequence(fit: ModuleType, models: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NO_ESTIMATE", "1")
    rc, res, argvs = _run(fit, tmp_path, models, 14, monkeypatch, "--min-context", "65536", weights_gib=10.2)
    # 0.8 x 14 = 11.2 GiB, 10.2 GiB of weights, at least 1.05 GiB of activations: no KV memory at any setting
    assert rc == 1
    assert [(a["context"], a["max_num_seqs"]) for a in res["attempts"]] == [
        (65536, 22), (65536, 11), (65536, 5), (65536, 2), (65536, 1)]
    assert res["summary"]["fits"] is None and res["summary"]["shipped_error_kind"] == "no_kv_memory"
    assert len(argvs) == 5
    # weights over the budget: one attempt, nothing smaller can start
    rc, res, argvs = _run(fit, tmp_path, models, 14, monkeypatch, weights_gib=12.0)
    assert rc == 1 and len(argvs) == 1 and res["attempts"][0]["weights_exceed_budget"] is True
    assert res["attempts"][0]["vllm"]["available_kv_gib"] == pytest.approx(11.2 - 12.0 - 2.1, abs=0.01)


def test_weights_stand_in_gives_the_card_its_room(fit: ModuleType, models: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    counted = fit.bf16_weights_gib(models, "dflash")
    # published: 25.2B text + ~0.55B vision parameters, at 2 bytes ~48 GiB, plus the drafter's ~1 GiB
    assert 48.0 < counted < 50.0
    # the fake loads what the folders hold at bf16
    rc, res, _ = _run(fit, tmp_path, models, 24, monkeypatch, "--weights-stand-in", weights_gib=counted)
    assert res["stand_in"] == {"bf16_weights_gib_counted": round(counted, 2), "recipe_weights_gib": 16.5}
    assert res["extra_gib"] == pytest.approx(counted - 16.5, abs=0.001)
    # left for activations and KV: 19.2 - 16.5 = 2.7 GiB, as on the card with its 4-bit weights; 22 sequences'
    # activations (2.1 GiB) leave ~0.6 GiB, under 4096 tokens; 11 leave ~1.15 GiB, over
    assert rc == 0
    assert [(a["context"], a["max_num_seqs"], a["started"]) for a in res["attempts"]] == [
        (65536, 22, False), (4096, 22, False), (4096, 11, True)]
    assert res["summary"]["at"]["stand_in_residual_gib"] == pytest.approx(0.0, abs=0.011)
    assert res["summary"]["at"]["available_kv_gib"] == pytest.approx(19.2 - 16.5 - 1.55, abs=0.02)
    folded = fit.fold([tmp_path / "card-24.json"])
    assert list(folded["table"]["gemma4-26b-a4b-nvfp4-dflash"]) == ["24 stand-in"]
    with pytest.raises(SystemExit, match="two runs of gemma4-26b-a4b-nvfp4-dflash at 24 stand-in"):
        fit.fold([tmp_path / "card-24.json", tmp_path / "card-24.json"])


def test_the_run_e2e_step_runs_one_card(tmp_path: Path, models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`run_e2e.sh fit:RECIPE:CARD`, the GPU session's one command per card, on a stage of its own: without the
    installed wheel it says what is missing; with one (empty here: the fake stands in for vLLM) it writes
    real_size.py's folders and the card's result."""
    stage = tmp_path / "stage"
    env = dict(os.environ, G4E2E_STAGE=str(stage), G4E2E_PIN="vllm-0.21.0", PYTHON=sys.executable)
    env.pop("OUT", None)
    script = ROOT / "tests" / "gpu" / "e2e" / "run_e2e.sh"
    step = "fit:gemma4-26b-a4b-nvfp4-mtp:32"
    proc = subprocess.run(["bash", str(script), step], capture_output=True, text=True, env=env, timeout=120)
    assert "fit: overlaid wheel not installed (run prepare first)" in proc.stdout
    for d in ("patched", "deps-serve", "deps"):
        (stage / d).mkdir(parents=True, exist_ok=True)
    (stage / "g4").symlink_to(ROOT / "toolkit")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text('#!/usr/bin/env bash\n[[ "$*" == *query-gpu* ]] && echo 9.0 || echo GPU\n')
    (bindir / "fake-vllm").write_text(f'#!/usr/bin/env bash\nexec {sys.executable} {FAKE} "$@"\n')
    for f in bindir.iterdir():
        f.chmod(0o755)
    env.update(PATH=f"{bindir}{os.pathsep}{env['PATH']}", FAKE_CALLS=str(tmp_path / "calls.jsonl"),
               FAKE_TOTAL_GIB="140", FAKE_WEIGHTS_GIB="12", FAKE_KV_BYTES_PER_TOKEN="225280",
               G4E2E_FIT_ARGS=f"--vllm-command {bindir / 'fake-vllm'} --total-bytes {140 * GIB} "
                              f"--port {_free_port()} --mtp-folder mtp-standin")
    proc = subprocess.run(["bash", str(script), step], capture_output=True, text=True, env=env, timeout=300)
    out = stage / "acc" / "fit-gemma4-26b-a4b-nvfp4-mtp-32.json"
    assert out.is_file(), proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert (stage / "real" / "meta.json").is_file()
    assert res["drafter_folder"] == "mtp-standin" and res["util"] == 0.1828
    assert res["summary"]["started_at_shipped"] is False and res["summary"]["fits"]["max_num_seqs"] == 22
    argv = json.loads((tmp_path / "calls.jsonl").read_text().splitlines()[0])
    assert json.loads(argv[argv.index("--speculative-config") + 1])["model"] == str(stage / "real" / "mtp-standin")


def test_stop_waits_for_the_whole_process_group(fit: ModuleType, tmp_path: Path) -> None:
    """The script's child (vLLM's engine core) outlives the script: stop() returns only once it is gone."""
    marker, ready = tmp_path / "child-ended", tmp_path / "child-ready"
    child = ("import pathlib, signal, sys, time\n"
             f"def bye(*a):\n time.sleep(2); pathlib.Path({str(marker)!r}).touch(); sys.exit(0)\n"
             f"signal.signal(signal.SIGINT, bye); pathlib.Path({str(ready)!r}).touch()\n"
             "while True: time.sleep(0.1)\n")
    parent = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}])\n"
              "try:\n while True: time.sleep(0.1)\nexcept KeyboardInterrupt:\n pass\n")
    proc = subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)
    while not ready.exists():
        time.sleep(0.1)
    fit.stop(proc)
    assert marker.exists()
    assert not fit.group_alive(proc.pid)


def test_without_torch_the_total_is_a_clear_error(fit: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    (tmp_path / "torch.py").write_text("raise ImportError('no torch here')\n")  # shadows any installed torch
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    want = r"torch could not read the device's memory \(exit 1\): ImportError: no torch here; run on"
    with pytest.raises(SystemExit, match=want):
        fit.device_total_bytes()


def test_a_render_that_fails_is_recorded(fit: ModuleType, models: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A --set the recipe refuses: the run's JSON says why instead of a traceback, and no server was started."""
    rc, res, argvs = _run(fit, tmp_path, models, 32, monkeypatch, "--set", "args.no-such-flag=1")
    assert rc == 1 and argvs == []
    (row,) = res["attempts"]
    assert row["vllm"]["error_kind"] == "render"
    assert row["vllm"]["error"].startswith("recipe render exited ")


CARD_FIT_RUNS = ROOT / "tests" / "gpu" / "results" / "card-fit"


def test_a_started_run_has_no_shipped_error_and_superseded_runs_fold_apart(fit: ModuleType, tmp_path: Path) -> None:
    """The recorded runs: the DFlash recipe started at its shipped 65536 / 22, yet its server logged a chat-template
    error after starting (the stand-in tokenizer has none): the row carries no shipped error. The run of the
    settings it shipped before (131072, max-num-batched-tokens 32768) folds under superseded, with vLLM's refusal."""
    new = CARD_FIT_RUNS / "fit-gemma4-26b-a4b-nvfp4-dflash-32-stand-in.json"
    old = CARD_FIT_RUNS / "superseded-fit-gemma4-26b-a4b-nvfp4-dflash-32-stand-in-131072-b32768.json"
    raw = json.loads(new.read_text())
    assert raw["attempts"][0]["started"] and "chat template" in raw["attempts"][0]["vllm"]["error"]
    row = fit.summarize(raw)
    assert row["started_at_shipped"] and row["shipped_error"] is None and row["shipped_error_kind"] is None
    folded = fit.fold([new], [old])
    assert folded["table"]["gemma4-26b-a4b-nvfp4-dflash"]["32 stand-in"]["fits"] == {"context": 65536,
                                                                                      "max_num_seqs": 22}
    before = folded["superseded"]["table"]["gemma4-26b-a4b-nvfp4-dflash"]["32 stand-in"]
    assert before["shipped_error_kind"] == "kv_too_small" and before["vllm_estimated_max_model_len"] == 5360
    assert folded["superseded"]["runs"] == [old.name]
    assert "superseded" not in fit.fold([new])
    # what the fold wrote is what is recorded
    recorded = json.loads((ROOT / "tests" / "gpu" / "results" / "vllm-0.21.0-card-fit.json").read_text())
    runs = sorted(CARD_FIT_RUNS.glob("fit-*.json"))
    assert fit.fold(runs, sorted(CARD_FIT_RUNS.glob("superseded-*.json"))) == recorded


def test_a_card_run_at_its_own_utilization_is_recorded_and_named(fit: ModuleType, models: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # 24 GiB at 0.85 instead of the recipe's 0.80: 20.4 GiB of budget, the utilization passed scaled to it
    _, res, argvs = _run(fit, tmp_path, models, 24, monkeypatch, "--util", "0.85",
                         "--set", "args.max-num-batched-tokens=2496")
    assert res["budget_gib"] == pytest.approx(20.4, abs=0.01) and res["recipe_util"] == 0.8
    assert argvs[0][argvs[0].index("--gpu-memory-utilization") + 1] == str(res["util"])
    assert argvs[0][argvs[0].index("--max-num-batched-tokens") + 1] == "2496"
    assert res["changed"] == {"gpu-memory-utilization": 0.85, "max-num-batched-tokens": "2496"}
    key = fit.row_key(res["summary"])
    assert key == "24 (gpu-memory-utilization 0.85, max-num-batched-tokens 2496)"
    # a way out's context: the first attempt renders it, and the row names it
    _, ctx_res, ctx_argvs = _run(fit, tmp_path, models, 24, monkeypatch, "--util", "0.85", "--context", "9888",
                                 "--set", "args.max-num-batched-tokens=2496")
    assert ctx_argvs[0][ctx_argvs[0].index("--max-model-len") + 1] == "9888"
    assert ctx_res["changed"]["max-model-len"] == 9888 and ctx_res["shipped"]["context"] == 65536
    assert "max-model-len 9888" in fit.row_key(ctx_res["summary"])
    # the recipe's own utilization given as --util changes nothing: the row is the card's
    _, same, _ = _run(fit, tmp_path, models, 24, monkeypatch, "--util", "0.8")
    assert same["changed"] == {} and fit.row_key(same["summary"]) == "24"
    # the run scales the utilization itself: a --set of it would undo the card's share
    with pytest.raises(SystemExit, match="give the card's utilization with --util"):
        _run(fit, tmp_path, models, 24, monkeypatch, "--set", "args.gpu-memory-utilization=0.9")


def test_a_card_with_a_row_runs_the_row(fit: ModuleType, models: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe as shipped on a 24 GB card: its cards table's row is what the run renders and records, as a user's
    `recipe render --set hardware.vram_gb=24` has it."""
    rc, res, argvs = _run(fit, tmp_path, models, 24, monkeypatch, recipe="gemma4-26b-a4b-nvfp4-dflash")
    assert rc == 0 and res["recipe"] == "gemma4-26b-a4b-nvfp4-dflash"
    assert res["shipped"] == {"context": 24576, "max_num_seqs": 22} and res["card_util"] == 0.9
    assert "24 GB card" in res["card_row"] and res["changed"] == {}
    assert res["budget_gib"] == pytest.approx(0.9 * 24, abs=0.02)  # the share is rounded down
    argv = argvs[0]
    assert argv[argv.index("--max-model-len") + 1] == "24576"
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "2496"
    assert fit.summarize(res)["card_util"] == 0.9 and fit.row_key(fit.summarize(res)) == "24 card row"
