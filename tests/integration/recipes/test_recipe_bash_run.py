"""Rendered bash scripts run for real, with recording stubs for vllm, nvidia-smi and python3 first on PATH."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.integration.recipes.conftest import REPO, Stubs, g4build, make_wheel

from g4build.pins.model import load_pins
from g4build.pins.serving import check_program

KNOWN_GOOD_ENV = {
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "VLLM_USE_FLASHINFER_MOE_FP4": "0",
    "VLLM_TEST_FORCE_FP8_MARLIN": "0",
    "VLLM_NVFP4_GEMM_BACKEND": "flashinfer-cutlass",
    "VLLM_USE_FLASHINFER_SAMPLER": "1",
}
# the users' known-good flags for the target alone, but for max-num-batched-tokens (8192, not 32768) and, with
# the DFlash drafter, max-model-len (65536): what one request of max-model-len needs in vLLM's KV sizing
# (test_kv_need.py)
KNOWN_GOOD_ARGS = [
    "--served-model-name", "gemma-4-26b-a4b",
    "--max-model-len", "131072",
    "--max-num-seqs", "22",
    "--max-num-batched-tokens", "8192",
    "--gpu-memory-utilization", "0.8",
    "--enable-chunked-prefill",
    "--enable-prefix-caching",
    "--trust-remote-code",
    "--enable-auto-tool-choice",
    "--tool-call-parser", "gemma4",
    "--mm-processor-cache-gb", "0",
]
DFLASH_ARGS = [a if a != "131072" else "65536" for a in KNOWN_GOOD_ARGS]


def render(tmp_path: Path, name: str, *extra: str) -> Path:
    out = tmp_path / "out"
    result = g4build("recipe", "render", name, "--shell", "bash", "--out", str(out), *extra)
    assert result.returncode == 0, result.stderr
    script = out / f"{Path(name).stem}.sh"
    assert os.access(script, os.X_OK)
    return script


def test_dflash_recipe_runs_vllm_with_the_exact_command(tmp_path: Path, stubs: Stubs) -> None:
    result = stubs.run(render(tmp_path, "gemma4-26b-a4b-nvfp4-dflash"))
    assert result.returncode == 0, result.stderr
    calls = stubs.calls()
    assert [c["prog"] for c in calls] == ["nvidia-smi", "nvidia-smi", "python3", "python3", "vllm"]
    assert calls[0]["argv"] == ["-L"]
    assert calls[1]["argv"] == ["--query-gpu=compute_cap", "--format=csv,noheader"]
    assert calls[2]["argv"] == ["-c", check_program(load_pins().get("vllm-0.21.0"))]  # the pin's environment
    assert calls[3]["argv"][0] == "-c" and "find_spec('flashinfer')" in calls[3]["argv"][1]  # exits 0: present
    assert "warning" not in result.stderr
    vllm = calls[4]
    assert vllm["argv"] == [
        "serve", "./models/gemma-4-26B-A4B-it-NVFP4", *DFLASH_ARGS,
        "--speculative-config",
        '{"method":"dflash","model":"./models/gemma-4-26B-A4B-it-DFlash","num_speculative_tokens":15,'
        '"attention_backend":"flash_attn"}',
    ]
    assert {k: vllm["env"][k] for k in KNOWN_GOOD_ENV} == KNOWN_GOOD_ENV
    assert "GPU 0: NVIDIA GeForce RTX 5090" in result.stdout


def test_mtp_and_baseline_recipes(tmp_path: Path, stubs: Stubs) -> None:
    assert stubs.run(render(tmp_path, "gemma4-26b-a4b-nvfp4-mtp")).returncode == 0
    assert stubs.run(render(tmp_path, "gemma4-26b-a4b-nvfp4-baseline")).returncode == 0
    mtp, base = [c for c in stubs.calls() if c["prog"] == "vllm"]
    assert mtp["argv"] == ["serve", "./models/gemma-4-26B-A4B-it-NVFP4", *KNOWN_GOOD_ARGS, "--speculative-config",
                           '{"method":"mtp","model":"google/gemma-4-26B-A4B-it-assistant","num_speculative_tokens":4}']
    assert base["argv"] == ["serve", "./models/gemma-4-26B-A4B-it-NVFP4", *KNOWN_GOOD_ARGS]


HOSTILE = {
    "space": "two words",
    "single": "it's",
    "double": 'say "hi"',
    "dollar": "$HOME ${PATH} $(touch PWNED-dollar)",
    "backtick": "`touch PWNED-backtick`",
    "semicolon": "a; touch PWNED-semicolon; b",
    "newline": "line1\ntouch PWNED-newline\nline3",
    "unicode": "ünïcödé ✓ 日本語 \u2019q\u2019",
    "backslash": "C:\\My Models\\x\\",
    "glob": "* ? [a] ~",
    "empty": "",
    "dash": "-looks-like-an-option",
    "json": '{"a": "b c", "d": [1, "x\\"y"]}',
}


def yaml_text(value: str) -> str:
    """A --set value that reads back as exactly ``value`` (JSON strings are YAML double-quoted strings)."""
    return json.dumps(value, ensure_ascii=False)


@pytest.mark.parametrize("key", sorted(HOSTILE))
def test_hostile_values_reach_vllm_exactly_and_run_nothing(tmp_path: Path, stubs: Stubs, key: str) -> None:
    value = HOSTILE[key]
    sets = [
        "--set", f"args.tool-call-parser={yaml_text(value)}",
        "--set", f"env.G4_HOSTILE={yaml_text(value)}", "--allow-env", "G4_HOSTILE",  # a name off the list
        "--set", f"speculative.model={yaml_text(value)}",
        "--set", f"served_model_names=[{yaml_text('name ' + value if value.startswith('-') else value or 'x')}]",
    ]
    if not value.startswith("-") and value:
        sets += ["--set", f"model={yaml_text(value)}"]
    result = stubs.run(render(tmp_path, "gemma4-26b-a4b-nvfp4-dflash", *sets))
    assert result.returncode == 0, result.stderr
    [vllm] = [c for c in stubs.calls() if c["prog"] == "vllm"]
    argv = vllm["argv"]
    model = value if value and not value.startswith("-") else "./models/gemma-4-26B-A4B-it-NVFP4"
    served = "name " + value if value.startswith("-") else value or "x"
    parser = ["--tool-call-parser=" + value] if value.startswith("-") else ["--tool-call-parser", value]
    expected_args = [*DFLASH_ARGS[2:-4], *parser, *DFLASH_ARGS[-2:]]
    spec = ('{"method":"dflash","model":' + json.dumps(value, ensure_ascii=False)
            + ',"num_speculative_tokens":15,"attention_backend":"flash_attn"}')
    assert argv == ["serve", model, "--served-model-name", served, *expected_args, "--speculative-config", spec]
    assert json.loads(argv[-1])["model"] == value
    assert vllm["env"]["G4_HOSTILE"] == value
    assert not list(stubs.dir.parent.glob("**/PWNED*")) and not list(REPO.glob("PWNED*"))


def test_missing_nvidia_smi_stops_with_a_clear_message(tmp_path: Path, stubs: Stubs) -> None:
    script = render(tmp_path, "gemma4-26b-a4b-nvfp4-baseline")
    stubs.remove("nvidia-smi")
    result = stubs.run(script, extra_path="")
    assert result.returncode == 1
    assert "nvidia-smi was not found on PATH" in result.stderr
    assert stubs.calls() == []


def test_failing_nvidia_smi_stops_before_vllm(tmp_path: Path, stubs: Stubs) -> None:
    script = render(tmp_path, "gemma4-26b-a4b-nvfp4-baseline")
    stubs.add("nvidia-smi", 'print("NVIDIA-SMI has failed", file=sys.stderr); sys.exit(9)')
    result = stubs.run(script)
    assert result.returncode == 1
    assert "did not list a GPU" in result.stderr
    assert stubs.programs() == ["nvidia-smi"]


def test_wheel_beside_the_script_is_installed_first(tmp_path: Path, stubs: Stubs) -> None:
    out = tmp_path / "out dir with 'quotes' $x"
    out.mkdir()
    wheel = make_wheel(out / "vllm-0.21.0+cu130.g4.abc-cp38-abi3-linux_x86_64.whl")
    result = g4build("recipe", "render", "gemma4-26b-a4b-nvfp4-baseline", "--shell", "bash", "--out", str(out),
                     "--wheel", str(wheel))
    assert result.returncode == 0, result.stderr
    run = stubs.run(out / "gemma4-26b-a4b-nvfp4-baseline.sh")
    assert run.returncode == 0, run.stderr
    # is this build installed already (no: the stub says 0), pip, the pin's environment, the FlashInfer check
    assert stubs.programs() == ["nvidia-smi", "python3", "python3", "python3", "python3", "vllm"]
    [pip] = [c for c in stubs.calls() if c["prog"] == "python3" and c["argv"][0] == "-m"]
    assert pip["argv"] == ["-m", "pip", "install", str(wheel)]


@pytest.mark.parametrize(("present", "installs"), [("0.21.0+cu130.g4.abc", False), ("0.21.0+cu130.g4.old", True),
                                                   (None, True)])
def test_the_wheel_is_installed_only_where_that_build_is_missing(tmp_path: Path, stubs: Stubs, present: str | None,
                                                                 installs: bool) -> None:
    """python3 runs the script's real check program against a site folder holding ``present`` (or no vllm)."""
    site = tmp_path / "site"
    if present is not None:
        meta = site / f"vllm-{present}.dist-info"
        meta.mkdir(parents=True)
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {present}\n", encoding="utf-8")
    stubs.add("python3", 'if sys.argv[1] == "-c" and "distributions" in sys.argv[2]:\n'
                         f'    sys.path.insert(0, {str(site)!r})\n'
                         '    exec(sys.argv[2])')
    out = tmp_path / "out"
    wheel = make_wheel(out / "vllm-0.21.0+cu130.g4.abc-cp38-abi3-linux_x86_64.whl")
    done = g4build("recipe", "render", "gemma4-26b-a4b-nvfp4-baseline", "--shell", "bash", "--out", str(out),
                   "--wheel", str(wheel))
    assert done.returncode == 0, done.stderr
    run = stubs.run(out / "gemma4-26b-a4b-nvfp4-baseline.sh")
    assert run.returncode == 0, run.stderr
    pip = [c["argv"] for c in stubs.calls() if c["prog"] == "python3" and c["argv"][0] == "-m"]
    assert pip == ([["-m", "pip", "install", str(wheel)]] if installs else [])
    assert ("vllm 0.21.0+cu130.g4.abc is already installed here" in run.stderr) is not installs
    assert [c["prog"] for c in stubs.calls()][-1] == "vllm"


def test_failing_pip_stops_before_vllm(tmp_path: Path, stubs: Stubs) -> None:
    wheel = make_wheel(tmp_path / "elsewhere" / "vllm-0.21.0-cp38-abi3-linux_x86_64.whl")
    script = render(tmp_path, "gemma4-26b-a4b-nvfp4-baseline", "--wheel", str(wheel))
    stubs.add("python3", "sys.exit(1)")
    result = stubs.run(script)
    assert result.returncode == 1
    assert stubs.programs() == ["nvidia-smi", "python3", "python3"]  # is it installed (1: no), then pip
    assert stubs.calls()[-1]["argv"] == ["-m", "pip", "install", str(wheel)]


def test_another_gpu_only_warns(tmp_path: Path, stubs: Stubs) -> None:
    script = render(tmp_path, "gemma4-26b-a4b-nvfp4-baseline")
    stubs.gpu("9.0")
    result = stubs.run(script)
    assert result.returncode == 0, result.stderr
    assert "warning: this recipe is for sm120 (compute capability 12.0); nvidia-smi reports: 9.0" in result.stderr
    assert stubs.programs() == ["nvidia-smi", "python3", "python3", "vllm"]


def test_vllm_exit_status_is_the_scripts(tmp_path: Path, stubs: Stubs) -> None:
    script = render(tmp_path, "gemma4-26b-a4b-nvfp4-baseline")
    stubs.add("vllm", "sys.exit(7)")
    assert stubs.run(script).returncode == 7


def test_script_has_the_generated_header(tmp_path: Path) -> None:
    text = render(tmp_path, "gemma4-31b-dflash", "--set", "args.max-model-len=4096").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    from g4build import __version__

    assert lines[1] == (f"# Generated by g4build {__version__} from recipe 'gemma4-31b-dflash'. "
                        "Do not edit: re-render with")
    assert "# Rendered with --set for: args.max-model-len" in lines
    assert "set -euo pipefail" in lines


@pytest.mark.parametrize(("transformers", "allow", "serves"),
                         [("5.17.0", "", False), ("5.17.0", "0", False), ("5.14.0", "", True), ("5.17.0", "1", True)])
def test_a_transformers_the_pin_cannot_read_stops_before_vllm(tmp_path: Path, stubs: Stubs, transformers: str,
                                                             allow: str, serves: bool) -> None:
    """python3 runs the script's environment check for real against a site folder holding ``transformers``;
    G4BUILD_ALLOW_ENVIRONMENT=1 (and only 1) serves anyway, saying so."""
    site = tmp_path / "site"
    for project, version in (("transformers", transformers), ("torch", "2.11.0+cu130")):
        info = site / f"{project}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n")
    stubs.add("python3", "if sys.argv[1:2] == ['-c'] and 'importlib.metadata as m' in sys.argv[2]:\n"
                         "    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
    env = {"PYTHONPATH": str(site), **({"G4BUILD_ALLOW_ENVIRONMENT": allow} if allow else {})}
    result = stubs.run(render(tmp_path, "gemma4-26b-a4b-nvfp4-baseline"), env=env)
    if serves:
        assert result.returncode == 0, result.stderr
        assert stubs.programs()[-1] == "vllm"
        if transformers == "5.14.0":
            assert result.stderr == ""
        else:  # the check still says what is wrong, then that it serves anyway
            assert result.stderr.splitlines()[0].startswith("error: transformers 5.17.0 is installed here")
            assert result.stderr.splitlines()[-1] == ("note: G4BUILD_ALLOW_ENVIRONMENT=1: serving outside the "
                                                      "environment this vLLM was checked with")
        return
    assert result.returncode == 1
    assert stubs.programs() == ["nvidia-smi", "python3"]  # no FlashInfer check, no vllm
    assert result.stderr.splitlines() == [
        "error: transformers 5.17.0 is installed here, expected transformers>=5.5.1,<5.15: vLLM 0.21.0 reads the "
        "configs of the published Gemma 4 checkpoints with these transformers only (g4build pin data)",
        "hint: pip install 'transformers>=5.5.1,<5.15' (in this environment), then start again",
        "hint: where the checkpoint's config was adapted to this transformers, G4BUILD_ALLOW_ENVIRONMENT=1 serves "
        "anyway",
    ]
