"""tests/gpu/fa2_sm12x: the FA2 dispatch model against what the proxy-built library logged on the H100 (the kept
result), the judge's rules, the kept result reproduced from its recorded launches, and lib_archs.py on libraries
this machine's nvcc builds. The GPU run itself happens on the device machine."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

HERE = Path(__file__).resolve().parents[2] / "gpu" / "fa2_sm12x"
RESULT = Path(__file__).resolve().parents[2] / "gpu" / "results" / "fa2-sm12x-proxy.json"
NATIVE = Path(__file__).resolve().parents[2] / "device" / "results" / "fa2-sm120-library.json"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(HERE))
    try:
        spec = importlib.util.spec_from_file_location(f"fa2_{name}", HERE / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(HERE))


@pytest.fixture(scope="module")
def selection() -> ModuleType:
    return _load("selection")


@pytest.fixture(scope="module")
def proxy() -> ModuleType:
    return _load("proxy_run")


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    return json.loads(RESULT.read_text())


def test_model_predicts_every_launch_the_library_logged(selection: ModuleType, result: dict[str, Any]) -> None:
    """For each shape and profile of the H100 run, the model gives the tile, flags and split count the proxy-built
    library reported launching (with SM120's and SM121's selection forced, and unmodified)."""
    here = selection.Gpu(**{**result["gpu"], "cc": tuple(result["gpu"]["cc"])})
    shapes = {s.name: s for s in selection.SHAPES}
    checked = 0
    for row in result["results"]:
        shape = shapes[row["shape"]["name"]]
        assert dataclasses.asdict(shape) == {
            **row["shape"],
            "q_lens": tuple(row["shape"]["q_lens"]),
            "k_lens": tuple(row["shape"]["k_lens"]),
            "window": tuple(row["shape"]["window"]),
        }
        for profile, got in row["profiles"].items():
            gpu = here if profile == "unmodified" else selection.GPUS[profile]
            want = selection.select(shape, gpu)
            (main, *rest) = got["launches"]
            assert (main["hdim"], main["block_m"], main["block_n"], main["warps"]) == (
                want["hdim"],
                want["block_m"],
                want["block_n"],
                want["warps"],
            ), (shape.name, profile)
            assert (bool(main["causal"]), bool(main["local"])) == (want["causal"], want["local"]), (shape.name, profile)
            assert max(main["num_splits"], 1) == want["num_splits"], (shape.name, profile)
            assert [launch["family"] for launch in rest] == (["combine"] if want["split"] else [])
            assert main["smem_dynamic"] == want["smem_dynamic"]
            checked += 1
    assert checked == len(selection.SHAPES) * 3


def test_sm12x_fits_and_differs_only_in_split_count(selection: ModuleType) -> None:
    """What the model says about SM120/121 for vLLM's paged path: the tiles are the H100's, the 256-wide tile
    needs 96 KiB of the 99 KiB there, and only the decode split count follows the SM count."""
    for shape in selection.SHAPES:
        on = {key: selection.select(shape, gpu) for key, gpu in selection.GPUS.items()}
        assert all(v["fits"] for v in on.values()), shape.name
        tiles = {(v["block_m"], v["block_n"], v["warps"], v["local"], v["causal"]) for v in on.values()}
        assert len(tiles) == 1, shape.name
    d256 = selection.select(
        selection.SHAPES[0].__class__("x", "", 256, 16, 8, (16,), (600,), causal=False), selection.GPUS["rtx5090"]
    )
    assert (d256["smem_dynamic"], d256["smem_headroom"]) == (98304, 3072)
    split = next(s for s in selection.SHAPES if s.name == "decode_gqa_split")
    counts = {key: selection.select(split, gpu)["num_splits"] for key, gpu in selection.GPUS.items()}
    assert counts["rtx5090"] != counts["gb10"] and min(counts.values()) > 1


def test_window_and_causal_normalised_as_fa2_does(selection: ModuleType) -> None:
    shape = selection.SHAPES[0].__class__
    gpu = selection.GPUS["rtx5090"]
    # a window wider than every key: causal kernel, not local
    short = selection.select(shape("s", "", 128, 8, 8, (16,), (100,), causal=False, window=(2047, 0)), gpu)
    assert (short["causal"], short["local"]) == (True, False)
    # a window that cuts: local, not causal (set_params_fprop takes causality from the window)
    cut = selection.select(shape("c", "", 128, 8, 8, (16,), (3000,), causal=True, window=(2047, 0)), gpu)
    assert (cut["causal"], cut["local"]) == (False, True)
    # one query row: causal is dropped; GQA without a window swaps heads into rows and may split
    decode = selection.select(shape("d", "", 128, 32, 4, (1, 1), (3000, 9000), causal=True), gpu)
    assert decode["seqlenq_ngroups_swapped"] and not decode["causal"]


def test_judge(proxy: ModuleType, selection: ModuleType) -> None:
    shape = next(s for s in selection.SHAPES if s.name == "draft_full_bf16")
    gpu = selection.GPUS["rtx5090"]
    launch = {
        "family": "splitkv",
        "hdim": 128,
        "block_m": 64,
        "block_n": 128,
        "warps": 4,
        "causal": 0,
        "local": 0,
        "num_splits": 0,
        "smem_total": 81920,
        "smem_static": 0,
        "regs": 255,
        "local_bytes": 8,
    }
    entry = {"launches": [launch], "max_abs_error": 0.004, "tolerance": 0.02}
    assert proxy.judge(shape, "rtx5090", entry, gpu)["pass"]  # num_splits 0 is FA2's "not split"
    assert not proxy.judge(shape, "rtx5090", {**entry, "launches": [{**launch, "block_n": 64}]}, gpu)["pass"]
    assert not proxy.judge(shape, "rtx5090", {**entry, "max_abs_error": 0.05}, gpu)["pass"]
    big = {**entry, "launches": [{**launch, "smem_total": 101377}]}
    assert not proxy.judge(shape, "rtx5090", big, gpu)["fits_imitated_gpu"]
    assert not proxy.judge(shape, "rtx5090", {**entry, "error": "refused"}, gpu)["pass"]


def test_kept_result_is_what_the_script_says(proxy: ModuleType, result: dict[str, Any], tmp_path: Path) -> None:
    """Rejudging the kept result from its recorded launches gives the kept verdicts (nothing edited by hand)."""
    recorded = tmp_path / "r.json"
    recorded.write_text(json.dumps(result))
    again = proxy.rejudge(recorded, [])
    for old, new in zip(result["results"], again["results"], strict=True):
        for profile in old["profiles"]:
            assert old["profiles"][profile]["pass"] == new["profiles"][profile]["pass"]
    assert result["all_pass"] and result["memcheck_clean"]
    assert "/" not in result["build"]["library"]


KERNEL = "__global__ void k(float* y) { y[threadIdx.x] += 1.0f; }\n"


def _nvcc_lib(tmp_path: Path, name: str, *gencode: str) -> Path:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    out = tmp_path / name
    subprocess.run(
        [nvcc, "-shared", "-Xcompiler", "-fPIC", *gencode, "-o", str(out), str(src)], check=True, capture_output=True
    )
    return out


@pytest.mark.nvcc
def test_lib_archs_on_real_libraries(tmp_path: Path) -> None:
    script = HERE / "lib_archs.py"
    toolkit = Path(__file__).resolve().parents[3] / "toolkit"
    native = _nvcc_lib(tmp_path, "native.so", "-gencode", "arch=compute_120,code=sm_120")
    ptx = _nvcc_lib(
        tmp_path, "ptx.so", "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_80,code=compute_80"
    )
    env = {"PYTHONPATH": str(toolkit), "PATH": ""}
    ok = subprocess.run(
        [sys.executable, str(script), str(native), "--arch", "sm_120", "--out", str(tmp_path / "a")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    got = json.loads((tmp_path / "a").read_text())
    assert set(got["sass"]) == {"sm_120"} and not got["ptx"] and got["verdicts"]["sm_120"]["verdict"] == "sass"
    bad = subprocess.run(
        [sys.executable, str(script), str(ptx), "--arch", "sm_120"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert bad.returncode == 1 and '"ptx-only"' in bad.stdout


def test_kept_native_library_result() -> None:
    """The sm_120 FA2 library built on the device: every cubin sm_120, no PTX, validate's verdict native."""
    got = json.loads(NATIVE.read_text())
    archs = got["library_archs"]
    assert archs["sass"] == {"sm_120": 52} and archs["ptx"] == {} and archs["verdicts"]["sm_120"]["ok"]
    assert archs["cuobjdump_elf_archs"] == {"sm_120": 52}
    assert got["compile_units"]["cuda_units"] == 52 and got["build"]["fa3_build_lines"] == 0
