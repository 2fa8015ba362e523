"""The FlashInfer route through the real CLI: `recipe check --wheel` says which case applies, and the launch
scripts, run for real with stubs (bash) or parsed by the PowerShell grammar, close every FlashInfer path where
FlashInfer is absent: fixed in the env for a wheel known to lack it, else by a check at start whose Python
program runs for real. The switches themselves are checked against the pinned sdists' own code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.integration.recipes.conftest import Stubs, g4build, make_wheel
from tests.integration.recipes.test_recipe_powershell_ast import PsScript, walk
from tests.support.trees import sdist_tree

from g4build.emit.manifest import make_manifest
from g4build.pins.model import load_pins
from g4build.pins.serving import check_program
from g4build.recipes.flashinfer import OPT_IN
from g4build.recipes.script import SHELLS, installed_program, probe_program
from g4build.util.shellquote import ps_quote, windows_word

RECIPE = "gemma4-26b-a4b-nvfp4-baseline"  # NVFP4 (flashinfer-cutlass GEMM) + FlashInfer sampler, needs no series
WIN_WHEEL = "vllm-0.21.0+cu130.g4.0123456789-cp312-cp312-win_amd64.whl"
WIN_METADATA = ("Metadata-Version: 2.4\nName: vllm\nVersion: 0.21.0\n"
                "Requires-Dist: flashinfer-python==0.6.8.post1; platform_system != \"Windows\"\n\n")
FI = "flashinfer_python-0.6.8.post1-py3-none-any.whl"
OFF = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NVFP4_GEMM_BACKEND": "cutlass"}
ON = {"VLLM_USE_FLASHINFER_SAMPLER": "1", "VLLM_NVFP4_GEMM_BACKEND": "flashinfer-cutlass"}


def _vllm_env(stubs: Stubs) -> dict[str, str]:
    [vllm] = [c for c in stubs.calls() if c["prog"] == "vllm"]
    return {k: vllm["env"][k] for k in OFF}


def test_check_knows_which_case_applies(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / WIN_WHEEL, metadata=WIN_METADATA)
    done = g4build("recipe", "check", RECIPE, "--wheel", str(wheel), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["flashinfer"]["presence"] == "absent"
    [finding] = [f for f in out["findings"] if f["rule"] == "flashinfer"]
    assert "the launch script sets VLLM_USE_FLASHINFER_SAMPLER=0, VLLM_NVFP4_GEMM_BACKEND=cutlass" in finding["message"]
    linux = make_wheel(tmp_path / "vllm-0.21.0-cp38-abi3-manylinux_2_24_x86_64.whl", metadata=WIN_METADATA)
    assert json.loads(g4build("recipe", "check", RECIPE, "--wheel", str(linux), "--json").stdout
                      )["flashinfer"]["presence"] == "present"
    bad = g4build("recipe", "check", RECIPE, "--wheel", str(wheel), "--set", "args.attention-backend=FLASHINFER")
    assert bad.returncode == 11 and "--attention-backend FLASHINFER needs FlashInfer" in bad.stdout


def test_script_for_a_wheel_without_flashinfer_has_it_off(tmp_path: Path, stubs: Stubs) -> None:
    out = tmp_path / "out"
    wheel = make_wheel(out / WIN_WHEEL, metadata=WIN_METADATA)
    done = g4build("recipe", "render", RECIPE, "--shell", "bash", "--out", str(out), "--wheel", str(wheel))
    assert done.returncode == 0, done.stderr
    result = stubs.run(out / f"{RECIPE}.sh")
    assert result.returncode == 0, result.stderr
    # is this build installed (no), pip, the pin's environment: no FlashInfer check at start
    assert stubs.programs() == ["nvidia-smi", "python3", "python3", "python3", "vllm"]
    assert not any("find_spec('flashinfer')" in " ".join(c["argv"]) for c in stubs.calls())
    assert _vllm_env(stubs) == OFF
    refused = g4build("recipe", "render", RECIPE, "--shell", "bash", "--wheel", str(wheel),
                      "--set", "env.VLLM_USE_FLASHINFER_SAMPLER=1")
    assert refused.returncode == 11 and "opens a FlashInfer path" in refused.stderr


def _real_probe(stubs: Stubs) -> None:
    """python3 runs the script's FlashInfer check program for real (without site-packages, where no flashinfer is);
    the pin's environment check answers 0 (it has tests of its own)."""
    stubs.add("python3", "if sys.argv[1:2] == ['-c'] and \"find_spec('flashinfer')\" in sys.argv[2]:\n"
                         "    os.execv(sys.executable, [sys.executable, '-S', *sys.argv[1:]])")


def test_the_check_at_start_closes_the_paths_only_where_flashinfer_is_missing(tmp_path: Path, stubs: Stubs) -> None:
    done = g4build("recipe", "render", RECIPE, "--shell", "bash", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    script = tmp_path / "out" / f"{RECIPE}.sh"
    _real_probe(stubs)
    missing = stubs.run(script)
    assert missing.returncode == 0, missing.stderr
    assert _vllm_env(stubs) == OFF
    assert "note: FlashInfer is not installed: serving without it (VLLM_USE_FLASHINFER_SAMPLER=0, " in missing.stderr
    stubs.record.unlink()
    fake = tmp_path / "site" / "flashinfer"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    there = stubs.run(script, env={"PYTHONPATH": str(fake.parent)})
    assert there.returncode == 0, there.stderr
    assert _vllm_env(stubs) == ON and "note: FlashInfer" not in there.stderr


def test_powershell_check_at_start_and_fixed_env(tmp_path: Path) -> None:
    done = g4build("recipe", "render", RECIPE, "--shell", "powershell", "--out", str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr
    ps = PsScript((tmp_path / "a" / f"{RECIPE}.ps1").read_bytes())
    assert not ps.root.has_error and ps.errors() == []
    assert {k: ps.env()[k] for k in ON} == ON and ps.env(conditional=True) == OFF
    [_environment, probe] = [n for n in walk(ps.root)
                             if n.type == "command" and n.text.decode().startswith("& $python -c ")]
    [program] = [n for n in walk(probe) if n.type == "string_literal"]
    assert ps._value(program) == probe_program()  # the exact program, under PowerShell's quoting
    wheel = make_wheel(tmp_path / "b" / WIN_WHEEL, metadata=WIN_METADATA)
    done = g4build("recipe", "render", RECIPE, "--shell", "powershell", "--out", str(tmp_path / "b"), "--wheel",
                   str(wheel))
    assert done.returncode == 0, done.stderr
    fixed = PsScript((tmp_path / "b" / f"{RECIPE}.ps1").read_bytes())
    assert {k: fixed.env()[k] for k in OFF} == OFF and fixed.env(conditional=True) == {}
    # no FlashInfer check at start (the `-c` programs left ask whether this build is installed already, and check
    # the pin's environment)
    assert [c for c in fixed.commands() if c.startswith("& $python -c ")] == [
        f"& $python -c {ps_quote(installed_program(WIN_WHEEL.split('-')[1]))}",
        f"& $python -c {ps_quote(check_program(load_pins().get('vllm-0.21.0')))}"]


def test_flashinfer_wheels_recorded_by_the_build_are_installed_with_it(tmp_path: Path, stubs: Stubs) -> None:
    pin = load_pins().get("vllm-0.21.0")
    record = {"source": "wheels", "version": pin.flashinfer, "wheels": [{"file": FI, "sha256": "0" * 64}]}
    manifest = make_manifest(pin, [], route="build", extra={"flashinfer": record}, base_os="windows")
    out = tmp_path / "wheels"
    wheel = make_wheel(out / WIN_WHEEL, manifest, metadata=WIN_METADATA)
    missing = g4build("recipe", "render", RECIPE, "--shell", "bash", "--out", str(out), "--wheel", str(wheel))
    assert missing.returncode == 11 and f"expected them beside it in {out}, found no {FI}" in missing.stderr
    make_wheel(out / FI)
    check = json.loads(g4build("recipe", "check", RECIPE, "--wheel", str(wheel), "--json").stdout)
    assert check["flashinfer"] == {
        "presence": "present", "wheels": [FI],
        "why": f"built with the FlashInfer wheels {FI} (sha256-checked), installed beside it"}
    for shell in SHELLS:
        done = g4build("recipe", "render", RECIPE, "--shell", shell, "--out", str(out), "--wheel", str(wheel))
        assert done.returncode == 0, done.stderr
    result = stubs.run(out / f"{RECIPE}.sh")
    assert result.returncode == 0, result.stderr
    [pip] = [c["argv"] for c in stubs.calls() if c["prog"] == "python3" and c["argv"][0] == "-m"]
    assert pip == ["-m", "pip", "install", str(wheel), str(out / FI)]
    assert _vllm_env(stubs) == ON  # the check at start found it (the stub's python3 exits 0)
    ps = PsScript((out / f"{RECIPE}.ps1").read_bytes())
    assert not ps.root.has_error
    assert "& $python -m pip install $wheel @flashinferWheels" in ps.commands()
    shellcheck = subprocess.run(["shellcheck", "--severity=style", "--enable=all", str(out / f"{RECIPE}.sh")],
                                capture_output=True, text=True, check=False) if _has("shellcheck") else None
    assert shellcheck is None or shellcheck.returncode == 0, shellcheck.stdout


def _has(program: str) -> bool:
    import shutil

    return shutil.which(program) is not None


@pytest.mark.network  # the pinned sdists (cached after the first run)
@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.33.0"])
def test_the_switches_are_what_the_pinned_vllm_reads(pin: str) -> None:
    tree = sdist_tree(pin)
    envs = (tree / "vllm/envs.py").read_text()
    # on unless set: the sampler then imports the FlashInfer backend, which imports flashinfer at its top
    assert re.search(r'"VLLM_USE_FLASHINFER_SAMPLER": lambda: \(\s+bool\(int\('
                     r'os.environ\["VLLM_USE_FLASHINFER_SAMPLER"\]\)\)\s+'
                     r'if "VLLM_USE_FLASHINFER_SAMPLER" in os.environ\s+else True', envs)
    sampler = (tree / "vllm/v1/sample/ops/topk_topp_sampler.py").read_text()
    assert re.search(r"if (not )?envs.VLLM_USE_FLASHINFER_SAMPLER:[\s\S]{0,400}?"
                     r"from vllm.v1.attention.backends.flashinfer import FlashInferBackend", sampler)
    assert re.search(r"^from flashinfer import", (tree / "vllm/v1/attention/backends/flashinfer.py").read_text(), re.M)
    if pin != "vllm-0.21.0":
        return
    for name in OPT_IN:  # off by default: the script only closes them where the recipe opens them
        assert re.search(rf'"{name}": lambda: bool\(\s*int\(os.getenv\("{name}", "0"\)\)', envs), name
    linear = (tree / "vllm/model_executor/kernels/linear/__init__.py").read_text()
    assert '"cutlass": CutlassNvFp4LinearKernel,' in linear and '"flashinfer-cutlass": FlashInferCutlassNvFp4' in linear
    assert re.search(r'raise ValueError\(\s+f"Forced NVFP4 kernel', linear)  # a forced unsupported one raises
    choices = re.search(r'"VLLM_NVFP4_GEMM_BACKEND": env_with_choices\(([\s\S]*?)\),\n', envs)
    assert choices and '"cutlass"' in choices[1] and '"flashinfer-cutlass"' in choices[1]
    cuda = (tree / "vllm/platforms/cuda.py").read_text()  # SM120 (12.x): FlashAttention first, not FlashInfer
    assert re.search(r"else:\s+return \[\s+AttentionBackendEnum.FLASH_ATTN,\s+AttentionBackendEnum.FLASHINFER,", cuda)


@pytest.mark.heavy
@pytest.mark.network
def test_the_registry_wheel_brings_flashinfer() -> None:
    from g4build.pins.index import cache_root, fetch_verified
    from g4build.recipes.context import read_wheel_info

    ref = load_pins().get("vllm-0.21.0").wheels["manylinux_x86_64"]
    wheel = fetch_verified("vllm", ref.file, ref.sha256, cache_dir=cache_root() / "wheels").path
    info = read_wheel_info(wheel).flashinfer
    assert info is not None and info.presence == "present"
    assert info.why == "it requires flashinfer-python==0.6.8.post1: pip installs FlashInfer with it"
    assert sys.version_info >= (3, 10)


LATER = "vllm-0.33.0"  # reads no VLLM_NVFP4_GEMM_BACKEND: the recipe's GEMM choice becomes --linear-backend there


def _linear_backend(stubs: Stubs) -> str:
    [vllm] = [c for c in stubs.calls() if c["prog"] == "vllm"]
    return str(vllm["argv"][vllm["argv"].index("--linear-backend") + 1])


@pytest.mark.network  # the pin's envs.py, from its sdist (cached after the first run)
def test_on_a_later_pin_the_check_at_start_switches_the_linear_backend(tmp_path: Path, stubs: Stubs) -> None:
    done = g4build("recipe", "render", RECIPE, "--shell", "bash", "--out", str(tmp_path / "out"),
                   "--set", f"pin={LATER}")
    assert done.returncode == 0, done.stderr
    script = tmp_path / "out" / f"{RECIPE}.sh"
    _real_probe(stubs)
    missing = stubs.run(script)
    assert missing.returncode == 0, missing.stderr
    assert _linear_backend(stubs) == "cutlass"
    assert "(VLLM_USE_FLASHINFER_SAMPLER=0, --linear-backend cutlass)" in missing.stderr
    [vllm] = [c for c in stubs.calls() if c["prog"] == "vllm"]
    assert "VLLM_NVFP4_GEMM_BACKEND" not in vllm["env"] and vllm["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    stubs.record.unlink()
    fake = tmp_path / "site" / "flashinfer"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    there = stubs.run(script, env={"PYTHONPATH": str(fake.parent)})
    assert there.returncode == 0, there.stderr
    assert _linear_backend(stubs) == "flashinfer_cutlass" and "note: FlashInfer" not in there.stderr


@pytest.mark.network
def test_on_a_later_pin_powershell_switches_both_argument_arrays(tmp_path: Path) -> None:
    done = g4build("recipe", "render", RECIPE, "--shell", "powershell", "--out", str(tmp_path / "a"),
                   "--set", f"pin={LATER}")
    assert done.returncode == 0, done.stderr
    ps = PsScript((tmp_path / "a" / f"{RECIPE}.ps1").read_bytes())
    assert not ps.root.has_error and ps.errors() == []
    args = ps.array("$vllmArgs")
    at = args.index("--linear-backend") + 1
    assert args[at] == "flashinfer_cutlass" and args[args.index("--moe-backend") + 1] == "marlin"
    switched = {n.children[0].text.decode(): ps._value(next(s for s in walk(n.children[-1])
                                                           if s.type == "string_literal"))
                for n in walk(ps.root) if n.type == "assignment_expression" and "[" in n.children[0].text.decode()}
    assert switched == {f"$vllmArgs[{at}]": "cutlass", f"$vllmArgsLegacy[{at}]": windows_word("cutlass")}
    assert "VLLM_NVFP4_GEMM_BACKEND" not in {**ps.env(), **ps.env(conditional=True)}
