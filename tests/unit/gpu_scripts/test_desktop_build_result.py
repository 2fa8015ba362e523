"""tests/device/desktop_build_result.py: a timed build's figures read from what the session collected, each from
its own file (the command's seconds from build_vllm_wheel.sh's last line, jobs from the manifest, the peak from
the memory samples in kB), and no result without the command's closing line."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "device" / "desktop_build_result.py"


def _results(root: Path, *, ended: bool, kernels: str = "gemma4") -> Path:
    d = root / "results" / "sm120"
    d.mkdir(parents=True)
    (d / "ninja_log").write_text("# ninja log v7\n"
                                 "0\t300000\t0\tCMakeFiles/_vllm_fa2_C.dir/src/flash_fwd_split_hdim128_fp16_sm80.cu.o\ta\n"
                                 "0\t100000\t0\tCMakeFiles/_C.dir/csrc/layernorm_kernels.cu.o\tb\n"
                                 "100000\t200000\t0\tCMakeFiles/_C.dir/csrc/cache_kernels.cu.o\tc\n"
                                 "300000\t310000\t0\t_C.abi3.so\td\n")
    (d / "build-out-tail.txt").write_text("built in 350s\n" + ("g4build wheel exited 0 after 351 s\n" if ended else ""))
    (d / "build.rc").write_text("0\n")
    (d / "g4build-state.json").write_text(json.dumps({"done": {"vllm": {"seconds": 320.5}}}))
    (d / "build-manifest.json").write_text(json.dumps({
        "env": {"MAX_JOBS": "2", "TORCH_CUDA_ARCH_LIST": "12.0f"},
        "build_options": {"flash_attn": "all", "kernels": kernels}, "wheels": ["vllm-x.whl"]}))
    (root / "results" / "ram.kb").write_text("500000\n6000000\n1000\n")  # 6,000,000 kB = 6.1 GB
    return root / "results"


def _run(results: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--results", str(results), "--cores", "2", "--machine", "m",
                           "--out", str(out)], capture_output=True, text=True, check=False)


def test_the_figures_come_from_the_runs_own_files(tmp_path: Path) -> None:
    done = _run(_results(tmp_path, ended=True), tmp_path / "r.json")
    assert done.returncode == 0, done.stderr
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["what"].startswith("g4build wheel --arch sm120 --os linux --no-flashinfer --kernels gemma4, timed on 2")
    assert r["command"] == {"rc": 0, "seconds": 351, "minutes": 5.8} and r["vllm_step_s"] == 320.5
    assert (r["jobs"], r["units"], r["cpu_seconds"], r["span_s"]) == (2, 3, 500, 310)
    assert r["packing_bound_s"] == 300  # the longest unit outweighs 500 CPU-seconds over 2 cores
    assert r["peak_memory_gb"] == 6.1 and r["peak_gb_per_job"] == 3.05 and r["wheels"] == ["vllm-x.whl"]


def test_the_command_names_the_profile_even_when_it_is_all(tmp_path: Path) -> None:
    """`--kernels auto` makes gemma4 sm120's default: a whole-set build written as the bare command would read
    as a gemma4 one. The manifest's resolved profile is always named."""
    done = _run(_results(tmp_path, ended=True, kernels="all"), tmp_path / "r.json")
    assert done.returncode == 0, done.stderr
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["what"].startswith("g4build wheel --arch sm120 --os linux --no-flashinfer --kernels all, timed on 2")


def test_a_build_that_did_not_end_writes_nothing(tmp_path: Path) -> None:
    done = _run(_results(tmp_path, ended=False), tmp_path / "r.json")
    assert done.returncode != 0 and "no 'g4build wheel exited RC after N s' line" in done.stderr
    assert not (tmp_path / "r.json").exists()


def test_a_builds_summary_reads_the_rc_collect_writes_and_validates_own_shape(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """collect writes build-<arch>.rc and `g4build validate --json` nests its checks under wheels[]: a summary that
    read neither said rc None and no checks for the sm_90 build that served."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from wheel_e2e_result import build_summary

    d = tmp_path / "sm90"
    d.mkdir()
    (d / "build-sm90.rc").write_text("0\n")
    (d / "validate.json").write_text(json.dumps({"ok": False, "wheels": [{"checks": [
        {"name": "tags", "ok": True}, {"name": "verdict sm_90", "ok": False}]}]}))
    s = build_summary(tmp_path, "sm90", None)
    assert s["rc"] == 0 and s["validate_ok"] is False
    assert s["validate_checks"] == {"tags": True, "verdict sm_90": False}
    (d / "build-sm90.rc").unlink()
    assert build_summary(tmp_path, "sm90", None)["rc"] is None


def test_the_brought_back_wheel_is_hashed_and_must_be_the_builds_own(tmp_path: Path) -> None:
    results = _results(tmp_path, ended=True)
    manifest = results / "sm120" / "build-manifest.json"
    name = "vllm-0.21.0+cu130.gemma4.g4.81eade00f7-cp310-abi3-manylinux_2_38_x86_64.whl"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "wheels": [name]}))
    wheel = tmp_path / name
    wheel.write_bytes(b"PK" + bytes(range(256)) * 5000)
    cmd = [sys.executable, str(SCRIPT), "--results", str(results), "--cores", "2", "--machine", "m",
           "--out", str(tmp_path / "r.json"), "--wheel"]
    done = subprocess.run([*cmd, str(wheel)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads((tmp_path / "r.json").read_text())["wheel"]
    assert got == {"file": name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
                   "bytes": 2 + 256 * 5000, "manifest_digest": "81eade00f7"}
    other = tmp_path / "vllm-0.21.0+cu130.g4.0000000000-cp310-abi3-manylinux_2_38_x86_64.whl"
    other.write_bytes(wheel.read_bytes())
    (tmp_path / "r.json").unlink()
    refused = subprocess.run([*cmd, str(other)], capture_output=True, text=True, check=False)
    assert refused.returncode != 0 and "not the wheel this build wrote" in refused.stderr
    assert not (tmp_path / "r.json").exists()
