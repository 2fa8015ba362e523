"""run_e2e.sh steps that need no GPU, run for real in bash on a stage of their own: the per-layer-config step
0.33.0 needs, and the torch step of a pin that has no torch stack of its own."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

E2E = Path(__file__).resolve().parents[2] / "gpu" / "e2e"


def _step(tmp_path: Path, *steps: str, pin: str = "vllm-0.33.0") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, G4E2E_STAGE=str(tmp_path / "stage"), G4E2E_PIN=pin)
    env.pop("OUT", None)
    return subprocess.run(["bash", str(E2E / "run_e2e.sh"), *steps], capture_output=True, text=True, env=env,
                          timeout=120)


def _config(path: Path, text: dict[str, object]) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"model_type": "gemma4", "text_config": text}))


def test_per_layer_config_drops_only_an_explicit_null(tmp_path: Path) -> None:
    trained = tmp_path / "stage" / "trained" / "target" / "config.json"
    tiny = tmp_path / "stage" / "models" / "target" / "config.json"
    _config(trained, {"head_dim": 256, "global_head_dim": 512, "per_layer_config": None})
    _config(tiny, {"head_dim": 256, "per_layer_config": {"5": {"head_dim": 512}}})  # a real one stays
    proc = _step(tmp_path, "per-layer-config")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(trained.read_text())["text_config"] == {"head_dim": 256, "global_head_dim": 512}
    assert json.loads(tiny.read_text())["text_config"]["per_layer_config"] == {"5": {"head_dim": 512}}
    assert "trained/target/config.json: per_layer_config left to transformers" in proc.stdout
    again = _step(tmp_path, "per-layer-config")  # nothing left to drop: quiet, still fine
    assert again.returncode == 0 and "left to transformers" not in again.stdout


def test_torch_step_on_a_pin_without_its_own_stack_stops_the_call(tmp_path: Path) -> None:
    proc = _step(tmp_path, "torch", "probe", pin="vllm-0.21.0")
    assert proc.returncode == 1
    assert "no torch-wheels-vllm-0.21.0.txt; vllm-0.21.0 runs on the machine's own torch" in proc.stdout
    assert "step probe" not in proc.stdout  # a failed torch step ends the call
    assert not (tmp_path / "stage" / "runs" / "probe.json").exists()


def test_reference_mtp_without_a_carried_drafter_names_what_is_missing(tmp_path: Path) -> None:
    target = tmp_path / "stage" / "trained" / "target" / "model.safetensors"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"")
    proc = _step(tmp_path, "reference-mtp", pin="vllm-0.21.0")
    assert proc.returncode == 1
    assert "no trained MTP drafter (carry .device/trained, run reference)" in proc.stdout
    assert "step reference-mtp failed (7)" in proc.stdout


def test_torch_step_without_staged_parts_names_what_is_missing(tmp_path: Path) -> None:
    proc = _step(tmp_path, "torch")
    assert proc.returncode == 1
    assert "no part was stashed yet" in proc.stderr + proc.stdout
    assert not (tmp_path / "stage" / "torch-site").exists()


def test_every_pin_with_its_own_torch_lists_the_pins_torch() -> None:
    import yaml

    pins = yaml.safe_load((E2E.parents[2] / "patches" / "pins.yaml").read_text())["pins"]
    lists = sorted(E2E.glob("torch-wheels-*.txt"))
    assert {p.name for p in lists} == {"torch-wheels-vllm-0.29.0.txt", "torch-wheels-vllm-0.33.0.txt"}
    for path in lists:
        pin = path.name.removeprefix("torch-wheels-").removesuffix(".txt")
        rows = [ln.split() for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
        assert all(len(r) == 2 and len(r[1]) == 64 for r in rows), path.name
        names = {r[0].split("-")[0]: r[0].split("-")[1] for r in rows}
        assert names["torch"] == pins[pin]["torch"], path.name
        assert {"triton", "nvidia_nccl_cu13", "torchvision"} <= set(names), path.name
    # the 0.33.0 run found its model loader needs compressed-tensors: its dependency list carries it
    deps = (E2E / "device-wheels-vllm-0.33.0.txt").read_text()
    assert "compressed_tensors-0.17.0-" in deps and "loguru-" in deps


SESSION = Path(__file__).resolve().parents[2] / "device" / "wheel_runs_session.sh"


def _session(g4s: Path, *args: str, out: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, G4S=str(g4s), G4_BUILDS="sm90 sm120")
    env.pop("OUT", None)
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(["bash", str(SESSION), *args], capture_output=True, text=True, env=env, timeout=300)


def test_a_built_wheel_comes_back_in_parts_and_joins_on_a_fresh_machine(tmp_path: Path) -> None:
    """`bring` returns a wheel in 15 MiB parts, four a call; `unpack` on another machine joins them only once all
    are there, byte for byte, and refuses a damaged part."""
    wheels = tmp_path / "built" / "work-sm90" / "wheels"
    wheels.mkdir(parents=True)
    whl = wheels / "vllm-0.21.0+cu130.g4.0123456789-cp310-abi3-manylinux_2_38_x86_64.whl"
    whl.write_bytes(os.urandom(5 * 15 * 2**20 + 123))  # six parts: two calls
    first, second = _session(tmp_path / "built", "bring", "sm90", out=tmp_path / "call1"), \
        _session(tmp_path / "built", "bring", "sm90", "5", out=tmp_path / "call2")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert sorted(p.name for p in (tmp_path / "call1" / "sm90").iterdir()) == ["1", "2", "3", "4"]
    assert sorted(p.name for p in (tmp_path / "call2" / "sm90").iterdir()) == ["5", "6"]
    assert all(p.stat().st_size <= 16 * 2**20 for p in (tmp_path / "call1").rglob("part"))
    fresh = tmp_path / "fresh"
    half = _session(fresh, "unpack", str(tmp_path / "call1"))
    assert "not every part staged yet" in half.stdout and not (fresh / "work-sm90" / "wheels").exists()
    done = _session(fresh, "unpack", str(tmp_path / "call2"))
    assert done.returncode == 0, done.stderr
    assert (fresh / "work-sm90" / "wheels" / whl.name).read_bytes() == whl.read_bytes()
    # a part damaged on the way is refused before anything is staged from it
    bad = tmp_path / "call2" / "sm90" / "6" / "part"
    data = bad.read_bytes()
    bad.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # flipped: "x" over a random byte was "x" 1 time in 256
    refused = _session(tmp_path / "other", "unpack", str(tmp_path / "call2"))
    assert refused.returncode == 4 and "damaged in transfer" in refused.stderr


def test_the_wait_that_sees_the_build_end_brings_it_back_in_the_same_call(tmp_path: Path) -> None:
    """With G4_BRING=1 the call whose wait sees the builds end also returns the logs and the first three parts
    of each wheel (8 files at most a call), so no later call, and no pause before it, is needed to keep them."""
    g4s = tmp_path / "g4s"
    wheels = g4s / "work-sm90" / "wheels"
    wheels.mkdir(parents=True)
    whl = wheels / "vllm-0.21.0+cu130.g4.0123456789-cp310-abi3-manylinux_2_38_x86_64.whl"
    whl.write_bytes(os.urandom(4 * 15 * 2**20 + 7))  # five parts
    (g4s / "build-sm90.pid").write_text("1\n")
    (g4s / "build-sm90.rc").write_text("0\n")  # ended
    (g4s / "build.start").write_text("0\n")
    (g4s / "results" / "sm90").mkdir(parents=True)
    env = dict(os.environ, G4S=str(g4s), G4_BUILDS="sm90", G4_BRING="1", OUT=str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    done = subprocess.run(["bash", str(SESSION), "wait", "5"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    returned = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert returned == ["sm90/1/part", "sm90/1/parts.json", "sm90/2/part", "sm90/2/parts.json", "sm90/3/part",
                        "sm90/3/parts.json", "wheel-runs.tgz"]
    # two builds: the first one's parts only, so the call stays within its 8 files
    (g4s / "work-sm120" / "wheels").mkdir(parents=True)
    (g4s / "work-sm120" / "wheels" / whl.name.replace("g4.0123456789", "g4.9876543210")).write_bytes(b"x" * 1000)
    (g4s / "build-sm120.pid").write_text("1\n")
    (g4s / "build-sm120.rc").write_text("0\n")
    (g4s / "results" / "sm120").mkdir(parents=True)
    (tmp_path / "both").mkdir()
    both = subprocess.run(["bash", str(SESSION), "wait", "5"], capture_output=True, text=True, timeout=300,
                          env=dict(env, G4_BUILDS="sm90 sm120", OUT=str(tmp_path / "both")))
    assert both.returncode == 0, both.stdout + both.stderr
    assert sorted(str(p.relative_to(tmp_path / "both")) for p in (tmp_path / "both").rglob("*") if p.is_file()) \
        == returned
    # without it, or while a build runs, nothing is brought
    (tmp_path / "out2").mkdir()
    quiet = subprocess.run(["bash", str(SESSION), "wait", "5"], capture_output=True, text=True, timeout=300,
                           env=dict(env, G4_BRING="", OUT=str(tmp_path / "out2")))
    assert quiet.returncode == 0 and not any((tmp_path / "out2").iterdir())
    (g4s / "build-sm90.rc").unlink()
    (tmp_path / "out3").mkdir()
    running = subprocess.run(["bash", str(SESSION), "wait", "1"], capture_output=True, text=True, timeout=300,
                             env=dict(env, OUT=str(tmp_path / "out3")))
    assert running.returncode == 3 and not any((tmp_path / "out3").iterdir())


def test_fit_steps_can_skip_the_training_wait(tmp_path: Path) -> None:
    """`e2e` waits for the tiny models' training before its steps (acc:, serve: need them); G4_WAIT_TRAIN=0 runs
    steps that need none (fit:, on real_size.py's folders) at once: the hold need not spend minutes waiting."""
    g4s = tmp_path / "g4s"
    (g4s / "work-sm90" / "wheels").mkdir(parents=True)
    whl = g4s / "work-sm90" / "wheels" / "vllm-0.21.0+cu130.g4.0123456789-cp310-abi3-manylinux_2_38_x86_64.whl"
    whl.write_bytes(b"w")
    harness = g4s / "repo" / "tests" / "gpu" / "e2e" / "run_e2e.sh"  # stands in for the harness: its arguments
    harness.parent.mkdir(parents=True)
    harness.write_text('echo "WHEEL=$G4E2E_WHEEL ARGS=$*" >> "$G4S/calls"\n')
    for wait in ("1", "0"):
        done = subprocess.run(["bash", str(SESSION), "e2e", "fit:gemma4-26b-a4b-nvfp4-dflash:32"], capture_output=True,
                              text=True, timeout=60, env=dict(os.environ, G4S=str(g4s), G4_WAIT_TRAIN=wait))
        assert done.returncode == 0, done.stderr
    assert (g4s / "calls").read_text().splitlines() == [
        f"WHEEL={whl} ARGS=wait:train+train-mtp built fit:gemma4-26b-a4b-nvfp4-dflash:32",
        f"WHEEL={whl} ARGS=built fit:gemma4-26b-a4b-nvfp4-dflash:32"]


def test_the_sampler_runs_are_named_apart_and_find_flashinfer_only_when_asked(tmp_path: Path) -> None:
    """acc:target:sampler on vLLM's sampler and on FlashInfer's writes two results, neither over target.json;
    the engine's PYTHONPATH takes the staged FlashInfer only for the FlashInfer run."""
    stage = tmp_path / "stage"
    (stage / "patched").mkdir(parents=True)
    (stage / "flashinfer").mkdir()
    (stage / "trained" / "dflash").mkdir(parents=True)
    (stage / "trained" / "dflash" / "model.safetensors").write_bytes(b"")
    fake = tmp_path / "python3"  # stands in for the engine: records its PYTHONPATH and arguments
    fake.write_text('#!/usr/bin/env bash\necho "PYTHONPATH=$PYTHONPATH ARGS=$*" >> "$(dirname "$0")/calls"\n')
    fake.chmod(0o755)
    for flag in ("0", "1"):
        env = dict(os.environ, G4E2E_STAGE=str(stage), G4E2E_PIN="vllm-0.21.0", PYTHON=str(fake),
                   VLLM_USE_FLASHINFER_SAMPLER=flag)
        env.pop("OUT", None)
        subprocess.run(["bash", str(E2E / "run_e2e.sh"), "acc:target:sampler"], env=env, capture_output=True,
                       text=True, timeout=120, check=True)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 2
    assert "acc/target-sampler.json" in calls[0] and f"{stage}/flashinfer" not in calls[0]
    assert "acc/target-sampler-fi.json" in calls[1] and f"{stage}/flashinfer" in calls[1]


def test_a_step_cost_run_without_the_overlaid_wheel_names_what_is_missing(tmp_path: Path) -> None:
    proc = _step(tmp_path, "cost:dflash-8", pin="vllm-0.21.0")
    assert "cost: overlaid wheel not installed (run prepare first)" in proc.stdout
    assert proc.returncode == 1 and "step cost:dflash-8 failed (7)" in proc.stdout  # a failed run fails the call
    assert not (tmp_path / "stage" / "acc" / "cost-dflash-8.json").exists()
    unknown = _step(tmp_path, "costs:dflash-8", pin="vllm-0.21.0")
    assert unknown.returncode == 2 and "unknown step costs:dflash-8" in unknown.stdout


def test_a_labelled_cost_step_adds_its_own_arguments(tmp_path: Path) -> None:
    """cost:VARIANT:LABEL: one background chain runs one variant two ways (the released attention and the split
    one): the label names the result and adds G4E2E_COST_ARGS_<LABEL> after the chain's G4E2E_COST_ARGS."""
    stage = tmp_path / "stage"
    (stage / "patched").mkdir(parents=True)
    (stage / "real").mkdir()
    (stage / "real" / "meta.json").write_text("{}")
    fake = tmp_path / "python3"  # stands in for step_costs.py: records its arguments
    fake.write_text('#!/usr/bin/env bash\necho "ARGS=$*" >> "$(dirname "$0")/calls"\n')
    fake.chmod(0o755)
    env = dict(os.environ, G4E2E_STAGE=str(stage), G4E2E_PIN="vllm-0.21.0", PYTHON=str(fake),
               G4E2E_COST_ARGS="--in-process --concurrency 1", G4E2E_COST_ARGS_split="--verify-split-kv 16")
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(E2E / "run_e2e.sh"), "cost:dflash-8:inproc", "cost:dflash-8:split"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 2
    assert "acc/cost-dflash-8-inproc.json --in-process --concurrency 1" in calls[0]
    assert calls[0].endswith("--concurrency 1") and "--verify-split-kv" not in calls[0]
    assert "acc/cost-dflash-8-split.json --in-process --concurrency 1 --verify-split-kv 16" in calls[1]
    bad = subprocess.run(["bash", str(E2E / "run_e2e.sh"), "cost:dflash-8:no-dash"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1 and "letters and digits only" in bad.stdout
